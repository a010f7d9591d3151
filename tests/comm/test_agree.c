/* SPDX-License-Identifier: Apache-2.0 */
/* The agreement primitive (src/comm/agree.h) at every world size it runs at: for every set of failing ranks
 * and every set of ranks whose fingerprint differs, every rank returns, the failing ones with their own
 * status and message, the others with the lowest failing rank's status or DTL_ERR_MISMATCH, naming the
 * ranks the oracle below expects; and DTL_CHECK is read when a communicator is made, inherited by a split. */
#include "comm/agree.h"
#include "dtl_test.h"

static dtl_comm *world;

/* "1,3" for the ranks in mask, as the agreement lists them. */
static void rank_list(unsigned mask, char *buf, size_t cap) {
  size_t o = 0;
  buf[0] = '\0';
  for (int r = 0; r < dt_size; r++)
    if (mask >> r & 1) o += (size_t)snprintf(buf + o, cap - o, o ? ",%d" : "%d", r);
}

static int popcount(unsigned m) {
  int n = 0;
  for (; m; m &= m - 1) n++;
  return n;
}

/* Odd ranks fail with DTL_ERR_OUT_OF_MEMORY, even ones with DTL_ERR_INVALID_ARGUMENT, so that the status the
 * others get tells which rank it came from. */
static dtl_status failure_of(int r) { return r % 2 ? DTL_ERR_OUT_OF_MEMORY : DTL_ERR_INVALID_ARGUMENT; }

static void every_set_of_failing_ranks_fails_every_rank(void) {
  for (unsigned mask = 0; mask < 1u << dt_size; mask++) {
    bool me = mask >> dt_rank & 1;
    char own[64];
    snprintf(own, sizeof own, "rank %d's own reason", dt_rank);
    dtl_status local = me ? dtl__error(failure_of(dt_rank), "%s", own) : DTL_OK;
    dtl_status st = dtl__agree(world, "agree_test", 42, local);
    if (mask == 0) {
      CHECK(st == DTL_OK, "mask 0x%x: %s %s", mask, dtl_status_name(st), dtl_last_error());
      continue;
    }
    if (me) {
      CHECK(st == local && strcmp(dtl_last_error(), own) == 0, "mask 0x%x: the failing rank got %s '%s'", mask,
            dtl_status_name(st), dtl_last_error());
      continue;
    }
    int lowest = __builtin_ctz(mask);
    char list[64], want[96];
    rank_list(mask, list, sizeof list);
    snprintf(want, sizeof want, "agree_test: rank%s %s failed (", popcount(mask) > 1 ? "s" : "", list);
    CHECK(st == failure_of(lowest), "mask 0x%x: %s (expected %s)", mask, dtl_status_name(st),
          dtl_status_name(failure_of(lowest)));
    CHECK(strstr(dtl_last_error(), want) != NULL, "mask 0x%x: '%s' lacks '%s'", mask, dtl_last_error(), want);
  }
}

/* The reference is the most common fingerprint, the lowest rank's among equally common ones; the ranks
 * named are the others. */
static unsigned expected_differing(unsigned odd) {
  int n_odd = popcount(odd), n_even = dt_size - n_odd;
  bool ref_odd = n_odd > n_even || (n_odd == n_even && (odd & 1));
  unsigned all = (1u << dt_size) - 1;
  return ref_odd ? all & ~odd : odd;
}

static void every_set_of_disagreeing_ranks_is_a_mismatch_naming_the_minority(void) {
  for (unsigned odd = 0; odd < 1u << dt_size; odd++) {
    uint64_t fp = (odd >> dt_rank & 1) ? 0x1234567890abcdefull : 0xfedcba0987654321ull;
    dtl_status st = dtl__agree(world, "agree_test", fp, DTL_OK);
    unsigned differ = expected_differing(odd);
    if (differ == 0) {
      CHECK(st == DTL_OK, "odd 0x%x: %s %s", odd, dtl_status_name(st), dtl_last_error());
      continue;
    }
    char list[64], want[96];
    rank_list(differ, list, sizeof list);
    snprintf(want, sizeof want, "rank%s %s made another call", popcount(differ) > 1 ? "s" : "", list);
    CHECK(st == DTL_ERR_MISMATCH, "odd 0x%x: %s", odd, dtl_status_name(st));
    CHECK(strstr(dtl_last_error(), want) != NULL, "odd 0x%x: '%s' lacks '%s'", odd, dtl_last_error(), want);
  }
}

/* A fingerprint travels as a non-negative int64, its top 63 bits: fingerprints that differ only in bit 0
 * agree, any higher bit tells them apart (callers mix their values into every bit). */
static void fingerprints_are_compared_on_their_top_63_bits(void) {
  CHECK_OK(dtl__agree(world, "agree_test", 0x8000000000000000ull | (uint64_t)(dt_rank & 1), DTL_OK));
  dtl_status st = dtl__agree(world, "agree_test", dt_rank == dt_size - 1 ? 1ull << 62 : 0, DTL_OK);
  CHECK(st == (dt_size > 1 ? DTL_ERR_MISMATCH : DTL_OK), "%s", dtl_status_name(st));
}

static void a_failure_outranks_a_disagreement_and_both_are_named(void) {
  if (dt_size < 3) return;
  /* rank 0 fails, the last rank disagrees, the rest agree. */
  dtl_status local = dt_rank == 0 ? dtl__error(DTL_ERR_INVALID_ARGUMENT, "rank 0's reason") : DTL_OK;
  dtl_status st = dtl__agree(world, "agree_test", dt_rank == dt_size - 1 ? 9 << 1 : 5 << 1, local);
  if (dt_rank == 0) {
    CHECK(st == DTL_ERR_INVALID_ARGUMENT && strcmp(dtl_last_error(), "rank 0's reason") == 0, "%s", dtl_last_error());
    return;
  }
  char want[64];
  snprintf(want, sizeof want, "rank %d also made another call", dt_size - 1);
  CHECK(st == DTL_ERR_INVALID_ARGUMENT, "%s", dtl_status_name(st));
  CHECK(strstr(dtl_last_error(), "rank 0 failed") && strstr(dtl_last_error(), want), "'%s'", dtl_last_error());
}

static void extra_values_become_their_maximum_on_every_rank_when_all_agree(void) {
  int64_t v[DTL__AGREE_MAX_EXTRA] = {dt_rank, -dt_rank, (int64_t)dt_rank * dt_rank, 7};
  CHECK_OK(dtl__agree_max(world, "agree_test", 3, DTL_OK, v, DTL__AGREE_MAX_EXTRA));
  CHECK(v[0] == dt_size - 1 && v[1] == 0 && v[2] == (int64_t)(dt_size - 1) * (dt_size - 1) && v[3] == 7,
        "got %lld %lld %lld %lld", (long long)v[0], (long long)v[1], (long long)v[2], (long long)v[3]);
  /* On failure they stay this rank's own. */
  int64_t w[1] = {dt_rank};
  dtl_status local = dt_rank == 0 ? dtl__error(DTL_ERR_INVALID_ARGUMENT, "no") : DTL_OK;
  dtl_status st = dtl__agree_max(world, "agree_test", 3, local, w, 1);
  CHECK(st == DTL_ERR_INVALID_ARGUMENT || dt_size == 1, "%s", dtl_status_name(st));
  CHECK(w[0] == dt_rank, "w = %lld", (long long)w[0]);
}

static void nonces_differ_between_calls_and_their_maximum_is_common(void) {
  int64_t a[1] = {dtl__agree_nonce(&a, dt_rank)}, b[1] = {dtl__agree_nonce(&b, dt_rank)};
  CHECK(a[0] > 0 && b[0] > 0 && a[0] != b[0], "nonces %lld %lld", (long long)a[0], (long long)b[0]);
  CHECK_OK(dtl__agree_max(world, "agree_test", 0, DTL_OK, a, 1));
  int64_t lo = a[0], hi = a[0];
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == hi, "the agreed nonce differs between ranks");
}

static void dtl_check_is_read_when_a_communicator_is_made_and_inherited_by_its_splits(void) {
  dtl_comm *on, *off, *child;
  setenv("DTL_CHECK", "1", 1);
  CHECK_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &on));
  setenv("DTL_CHECK", "0", 1);
  CHECK_OK(dtl_comm_from_mpi(MPI_COMM_WORLD, &off));
  CHECK(on->check && !off->check, "on %d off %d", on->check, off->check);
  CHECK_OK(dtl_comm_split(on, dt_rank % 2, 0, &child)); /* made while DTL_CHECK=0: inherits on */
  CHECK(child->check, "a split of a checked communicator is checked");
  dtl_comm_destroy(child);
  setenv("DTL_CHECK", "1", 1);
  CHECK_OK(dtl_comm_split(off, 0, 0, &child));
  CHECK(!child->check, "a split of an unchecked communicator is unchecked");
  dtl_comm_destroy(child);
  unsetenv("DTL_CHECK");
  dtl_comm_destroy(on);
  dtl_comm_destroy(off);
}

int main(int argc, char **argv) {
  dt_init(&argc, &argv);
  dt_watchdog_s = 30;
  if (dt_size > 16) return dt_skip("the failing-rank sets are enumerated up to 16 ranks");
  if (dtl_comm_from_mpi(MPI_COMM_WORLD, &world) != DTL_OK) return dt_skip("no communicator");
  RUN(every_set_of_failing_ranks_fails_every_rank);
  RUN(every_set_of_disagreeing_ranks_is_a_mismatch_naming_the_minority);
  RUN(fingerprints_are_compared_on_their_top_63_bits);
  RUN(a_failure_outranks_a_disagreement_and_both_are_named);
  RUN(extra_values_become_their_maximum_on_every_rank_when_all_agree);
  RUN(nonces_differ_between_calls_and_their_maximum_is_common);
  RUN(dtl_check_is_read_when_a_communicator_is_made_and_inherited_by_its_splits);
  dtl_comm_destroy(world);
  return dt_finish();
}
