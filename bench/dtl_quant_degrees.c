/* SPDX-License-Identifier: Apache-2.0 */
/* Which TP degrees (1..64) dtl_qlayout_create accepts for the DeepSeek-V3 and Llama-3-70B weight shapes, and at which
 * of them every scale block / group is also whole on each rank (no boundary block shared by two ranks): the table of
 * docs/quantized.md, "Which TP degrees work". One process, abstract meshes: `build/bench/dtl_quant_degrees`. */
#include <stdio.h>
#include <string.h>
#include <dtl.h>

static void row(const char *model, const char *tensor, const dtl_quant_format *f, int64_t R, int64_t C, int sdim,
                const char *how) {
  char ok[512] = "", whole[512] = "";
  size_t a = 0, b = 0;
  for (int k = 1; k <= 64; k++) {
    int allwhole = 1, made = 1;
    for (int c = 0; c < k && made; c++) {
      dtl_mesh *m;
      dtl_mesh_create_abstract(1, (int[]){k}, (int[]){c}, &m);
      dtl_qlayout *l;
      if (dtl_qlayout_create(m, f, 2, (int64_t[]){R, C}, (dtl_placement[]){dtl_shard(sdim)}, &l) != DTL_OK) {
        made = 0;
      } else {
        dtl_qbox q;
        dtl_qlayout_local_boxes(l, NULL, &q);
        int64_t blk = f->kind == DTL_QUANT_FP8_BLOCK ? 128 : (f->kind == DTL_QUANT_GPTQ || f->kind == DTL_QUANT_AWQ) && sdim == 1 ? 128 : 1;
        int64_t lo = q.offset[sdim], hi = lo + q.shape[sdim], N = sdim ? C : R;
        if (q.shape[sdim] && (lo % blk || (hi % blk && hi != N))) allwhole = 0;
        dtl_qlayout_destroy(l);
      }
      dtl_mesh_destroy(m);
    }
    if (!made) continue;
    a += snprintf(ok + a, sizeof ok - a, "%s%d", a ? " " : "", k);
    if (allwhole) b += snprintf(whole + b, sizeof whole - b, "%s%d", b ? " " : "", k);
  }
  int nok = 0;
  for (const char *p = ok; *p; p++) nok += *p == ' ';
  if (nok == 63) snprintf(ok, sizeof ok, "all 1..64");
  char ft[64];
  dtl_quant_format rf = *f;
  (void)rf;
  snprintf(ft, sizeof ft, "%s", dtl_quant_kind_name(f->kind));
  printf("| %s | %s [%lld, %lld] | %s | %s | %s | %s |\n", model, tensor, (long long)R, (long long)C, ft, how, ok,
         nok == 63 && !strcmp(whole, "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64") ? "all of them" : nok != 63 && !strcmp(ok, whole) ? "all of them" : whole);
}

int main(void) {
  dtl_quant_format fp8 = {.kind = DTL_QUANT_FP8_BLOCK}, gptq = {.kind = DTL_QUANT_GPTQ}, awq = {.kind = DTL_QUANT_AWQ},
                   q4k = {.kind = DTL_QUANT_GGUF_Q4_K};
  printf("| model | tensor [rows=out, cols=in] | format | split | TP degrees 1..64 accepted | of those, scale blocks/groups whole on every rank |\n|---|---|---|---|---|---|\n");
  row("DeepSeek-V3", "mlp.gate/up_proj", &fp8, 18432, 7168, 0, "column (S(0))");
  row("DeepSeek-V3", "mlp.down_proj", &fp8, 7168, 18432, 1, "row (S(1))");
  row("DeepSeek-V3", "expert gate/up_proj", &fp8, 2048, 7168, 0, "column (S(0))");
  row("DeepSeek-V3", "expert down_proj", &fp8, 7168, 2048, 1, "row (S(1))");
  const dtl_quant_format *l70[] = {&gptq, &awq, &q4k};
  for (int i = 0; i < 3; i++) {
    row("Llama-3-70B", "q_proj", l70[i], 8192, 8192, 0, "column (S(0))");
    row("Llama-3-70B", "o_proj", l70[i], 8192, 8192, 1, "row (S(1))");
    row("Llama-3-70B", "k_proj / v_proj", l70[i], 1024, 8192, 0, "column (S(0))");
    row("Llama-3-70B", "gate/up_proj", l70[i], 28672, 8192, 0, "column (S(0))");
    row("Llama-3-70B", "down_proj", l70[i], 8192, 28672, 1, "row (S(1))");
  }
  return 0;
}
