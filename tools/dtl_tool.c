/* SPDX-License-Identifier: Apache-2.0 */
/* The `dtl` command: explains redistribution plans, draws layouts and reports how the library was built,
 * all on abstract meshes, so it needs no MPI launch; only `dtl calibrate`, which measures the machine, initializes MPI. Uses the public API only,
 * plus the message quoting of src/common/quote.c (compiled into the tool), so that no argument is echoed
 * to a terminal raw. dtl_tool_main is the whole command, callable from tests and the fuzz target. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dtl.h>
#include <dtl/mpi.h>
#include "common/quote.h"
#include "dtl_tool.h"

enum { EXIT_BAD_ARGS = 2 };

static const char usage[] =
    "usage: dtl <command> [options]\n"
    "\n"
    "commands:\n"
    "  plan  --mesh 2x4 --shape 8,6 --from S0,R --to R,S1 [--dtype f32] [--coord 0,1]\n"
    "        [--alpha S] [--beta S/B] [--local-beta S/B] [--inter-alpha S] [--inter-beta S/B]\n"
    "        [--ranks-per-node N]\n"
    "        print how dtl redistributes a tensor between two layouts: each step's mesh dim,\n"
    "        collective, tensor dims, bytes sent and received at the coordinate (default all\n"
    "        zeros) and estimated time, then the total (cost model: the MPI defaults, then\n"
    "        DTL_PLAN_TUNE, then the options). --ranks-per-node N puts N consecutive ranks on\n"
    "        each node: steps over mesh dims that cross nodes pay inter_alpha/inter_beta, and\n"
    "        each step shows its link class and the bytes it sends to other nodes (xnode)\n"
    "  show  --mesh 2x2 --shape 8,8 [--dtype f32] [--ranks-per-node N] PLACEMENTS\n"
    "        draw which mesh coordinates hold which block of a 1-D or 2-D tensor (and the nodes)\n"
    "  info  version, backends built, default cost models, environment variables read\n"
    "  calibrate [--out FILE]\n"
    "        run under mpirun (e.g. mpirun -n 4 dtl calibrate --out dtl.profile): time the MPI\n"
    "        algorithms and measure the cost model on all ranks (a second or two), print them, and\n"
    "        write them as a profile for DTL_PROFILE (rank 0 writes; default file dtl.profile)\n"
    "  help  this text (also --help, -h)\n"
    "\n"
    "placements: one per mesh dim, comma-separated: R, S(d) or Sd (d may be negative), P or P(op)\n"
    "with op sum, prod, max, min, avg. dtypes: f32 f64 f16 bf16 i8 u8 i32 i64 f8e4m3 f8e5m2 (default\n"
    "f32; the 8-bit floats hold P(max) and P(min) only: any other reduction would round at every step).\n"
    "exit status: 0 done, 1 the request cannot be done (e.g. an unsupported transition), 2 bad arguments.\n";

/* Where the command writes (stdout and stderr for the program), set by dtl_tool_main. */
static FILE *out, *err;

/* An argument as it may be echoed: quoted by the library's rule (quote.h); one per message. */
static const char *q(const char *text) {
  static char buf[DTL__QUOTE_CAP];
  return dtl__quote(text, buf, sizeof buf);
}

static int bad_args(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(err, "dtl%s%s: ", cmd ? " " : "", cmd ? cmd : "");
  vfprintf(err, fmt, ap);
  va_end(ap);
  fprintf(err, "\n(dtl --help for usage)\n");
  return EXIT_BAD_ARGS;
}

/* A library call failed: invalid input is the caller's arguments (2), anything else the request (1). */
static int failed(const char *cmd, dtl_status st) {
  fprintf(err, "dtl %s: %s: %s\n", cmd, dtl_status_name(st), dtl_last_error());
  return st == DTL_ERR_INVALID_ARGUMENT ? EXIT_BAD_ARGS : 1;
}

/* "2x4" or "8,6": at most max integers >= min separated by sep, nothing else. */
static bool parse_ints(const char *text, char sep, long min, int max, long *out, int *n) {
  *n = 0;
  const char *p = text;
  for (;;) {
    if (*n == max || (!(*p >= '0' && *p <= '9') && *p != '-')) return false;
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno == ERANGE || v < min || v > 2147483647L) return false;
    out[(*n)++] = v;
    if (*end == '\0') return true;
    if (*end != sep) return false;
    p = end + 1;
  }
}

static bool parse_seconds(const char *text, double *out) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (end == text || *end || errno == ERANGE || !isfinite(v) || v < 0 || text[0] == ' ') return false;
  *out = v;
  return true;
}

typedef struct {
  const char *mesh, *shape, *dtype, *from, *to, *coord, *alpha, *beta, *local_beta, *inter_alpha, *inter_beta;
  const char *ranks_per_node, *positional;
} options;

/* Reads "--name value" and "--name=value" pairs (and at most one positional argument when allowed). */
static int parse_options(const char *cmd, int argc, char **argv, options *o, bool positional_ok) {
  static const struct {
    const char *name;
    size_t offset;
  } known[] = {
      {"mesh", offsetof(options, mesh)},   {"shape", offsetof(options, shape)},           {"dtype", offsetof(options, dtype)},
      {"from", offsetof(options, from)},   {"to", offsetof(options, to)},                 {"coord", offsetof(options, coord)},
      {"alpha", offsetof(options, alpha)}, {"beta", offsetof(options, beta)},             {"local-beta", offsetof(options, local_beta)},
      {"inter-alpha", offsetof(options, inter_alpha)}, {"inter-beta", offsetof(options, inter_beta)},
      {"ranks-per-node", offsetof(options, ranks_per_node)},
  };
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2) != 0) {
      if (!positional_ok || o->positional) return bad_args(cmd, "unexpected argument \"%s\"", q(a));
      o->positional = a;
      continue;
    }
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    int k = -1;
    for (size_t j = 0; j < sizeof known / sizeof *known; j++)
      if (strlen(known[j].name) == len && strncmp(known[j].name, name, len) == 0) k = (int)j;
    if (k < 0) {
      char opt[DTL__QUOTE_CAP];
      return bad_args(cmd, "unknown option \"%s\"", dtl__quote_n(a, len + 2, opt, sizeof opt));
    }
    const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!value || !*value) return bad_args(cmd, "option --%s needs a value", known[k].name);
    const char **slot = (const char **)((char *)o + known[k].offset);
    if (*slot) return bad_args(cmd, "option --%s given twice", known[k].name);
    *slot = value;
  }
  return 0;
}

/* The abstract mesh and the dtype/shape of --mesh, --coord, --dtype, --shape. */
static int make_mesh(const char *cmd, const options *o, dtl_mesh **mesh, dtl_dtype *dtype, int *ndim, int64_t *shape) {
  if (!o->mesh) return bad_args(cmd, "--mesh is required (e.g. --mesh 2x4)");
  if (!o->shape) return bad_args(cmd, "--shape is required (e.g. --shape 8,6)");
  long v[DTL_MAX_TENSOR_DIMS];
  int n;
  if (!parse_ints(o->mesh, 'x', 1, DTL_MAX_MESH_DIMS, v, &n))
    return bad_args(cmd, "--mesh \"%s\": expected 1 to %d sizes >= 1 separated by 'x' (e.g. 2x4)", q(o->mesh),
                    DTL_MAX_MESH_DIMS);
  int ms[DTL_MAX_MESH_DIMS], mn = n, coord[DTL_MAX_MESH_DIMS] = {0};
  for (int i = 0; i < n; i++) ms[i] = (int)v[i];
  if (o->coord) {
    if (!parse_ints(o->coord, ',', 0, DTL_MAX_MESH_DIMS, v, &n) || n != mn)
      return bad_args(cmd, "--coord \"%s\": expected %d coordinates >= 0 separated by ',' (one per mesh dim)",
                      q(o->coord), mn);
    for (int i = 0; i < n; i++) {
      if (v[i] >= ms[i]) return bad_args(cmd, "--coord \"%s\": coordinate %d is %ld (expected 0..%d)", q(o->coord), i, v[i],
                                        ms[i] - 1);
      coord[i] = (int)v[i];
    }
  }
  if (!parse_ints(o->shape, ',', 0, DTL_MAX_TENSOR_DIMS, v, &n))
    return bad_args(cmd, "--shape \"%s\": expected 1 to %d sizes >= 0 separated by ',' (e.g. 8,6)", q(o->shape),
                    DTL_MAX_TENSOR_DIMS);
  *ndim = n;
  for (int i = 0; i < n; i++) shape[i] = v[i];
  *dtype = DTL_FLOAT32;
  if (o->dtype && dtl_dtype_parse(o->dtype, dtype) != DTL_OK) return bad_args(cmd, "--dtype: %s", dtl_last_error());
  int rpn = 0;
  if (o->ranks_per_node) {
    if (!parse_ints(o->ranks_per_node, ',', 1, 1, v, &n))
      return bad_args(cmd, "--ranks-per-node \"%s\": expected one whole number >= 1 (ranks per node)",
                      q(o->ranks_per_node));
    rpn = (int)v[0];
  }
  dtl_status st = dtl_mesh_create_abstract(mn, ms, coord, mesh);
  if (st == DTL_OK && rpn) st = dtl_mesh_set_ranks_per_node(*mesh, rpn);
  return st == DTL_OK ? 0 : failed(cmd, st);
}

static int make_layout(const char *cmd, const char *what, const char *text, dtl_mesh *m, dtl_dtype t, int ndim,
                       const int64_t *shape, dtl_layout **out) {
  dtl_placement p[DTL_MAX_MESH_DIMS + 1];
  int n = 0;
  if (dtl_placements_parse(text, p, DTL_MAX_MESH_DIMS + 1, &n) != DTL_OK) return bad_args(cmd, "%s: %s", what, dtl_last_error());
  if (n != dtl_mesh_ndim(m))
    return bad_args(cmd, "%s \"%s\" has %d placement%s but the mesh has %d dim%s (expected one per mesh dim)", what, q(text), n,
                    n == 1 ? "" : "s", dtl_mesh_ndim(m), dtl_mesh_ndim(m) == 1 ? "" : "s");
  dtl_status st = dtl_layout_create(m, t, ndim, shape, p, out);
  if (st == DTL_ERR_INVALID_ARGUMENT) return bad_args(cmd, "%s \"%s\": %s", what, q(text), dtl_last_error());
  return st == DTL_OK ? 0 : failed(cmd, st);
}

static int cmd_plan(int argc, char **argv) {
  const char *cmd = "plan";
  options o = {0};
  int rc = parse_options(cmd, argc, argv, &o, false);
  if (rc) return rc;
  if (!o.from) return bad_args(cmd, "--from is required (the source placements, e.g. --from S0,R)");
  if (!o.to) return bad_args(cmd, "--to is required (the target placements, e.g. --to R,S1)");
  dtl_cost_model cost = {0};
  const struct {
    const char *text, *name;
    uint64_t bit;
    double *field;
  } knobs[] = {{o.alpha, "--alpha", DTL_COST_ALPHA, &cost.alpha_s},
               {o.beta, "--beta", DTL_COST_BETA, &cost.beta_s_per_byte},
               {o.local_beta, "--local-beta", DTL_COST_LOCAL_BETA, &cost.local_beta_s_per_byte},
               {o.inter_alpha, "--inter-alpha", DTL_COST_INTER_ALPHA, &cost.inter_alpha_s},
               {o.inter_beta, "--inter-beta", DTL_COST_INTER_BETA, &cost.inter_beta_s_per_byte}};
  for (int k = 0; k < (int)(sizeof knobs / sizeof *knobs); k++) {
    if (!knobs[k].text) continue;
    if (!parse_seconds(knobs[k].text, knobs[k].field))
      return bad_args(cmd, "%s \"%s\": expected a finite number of seconds >= 0 (e.g. 2e-6)", knobs[k].name,
                      q(knobs[k].text));
    cost.mask |= knobs[k].bit;
  }
  dtl_mesh *m = NULL;
  dtl_layout *src = NULL, *dst = NULL;
  dtl_plan *plan = NULL;
  dtl_dtype t;
  int ndim;
  int64_t shape[DTL_MAX_TENSOR_DIMS];
  if ((rc = make_mesh(cmd, &o, &m, &t, &ndim, shape))) goto out;
  if ((rc = make_layout(cmd, "--from", o.from, m, t, ndim, shape, &src))) goto out;
  if ((rc = make_layout(cmd, "--to", o.to, m, t, ndim, shape, &dst))) goto out;
  dtl_status st = cost.mask ? dtl_plan_create_with_cost(src, dst, &cost, &plan) : dtl_plan_create(src, dst, &plan);
  if (st != DTL_OK) {
    rc = failed(cmd, st);
    goto out;
  }
  size_t need = dtl_plan_explain_needed(plan);
  char *text = malloc(need);
  if (!text || (st = dtl_plan_explain(plan, text, need)) != DTL_OK) {
    rc = failed(cmd, text ? st : DTL_ERR_OUT_OF_MEMORY);
  } else {
    fputs(text, out);
  }
  free(text);
out:
  dtl_plan_destroy(plan);
  dtl_layout_destroy(src);
  dtl_layout_destroy(dst);
  dtl_mesh_destroy(m);
  return rc;
}

static int cmd_show(int argc, char **argv) {
  const char *cmd = "show";
  options o = {0};
  int rc = parse_options(cmd, argc, argv, &o, true);
  if (rc) return rc;
  if (o.from || o.to || o.coord || o.alpha || o.beta || o.local_beta || o.inter_alpha || o.inter_beta)
    return bad_args(cmd, "takes --mesh, --shape, --dtype, --ranks-per-node and the placements only");
  if (!o.positional) return bad_args(cmd, "the placements are required (e.g. dtl show --mesh 2x2 --shape 8,8 S0,S1)");
  dtl_mesh *m = NULL;
  dtl_layout *l = NULL;
  dtl_dtype t;
  int ndim;
  int64_t shape[DTL_MAX_TENSOR_DIMS];
  if ((rc = make_mesh(cmd, &o, &m, &t, &ndim, shape))) goto out;
  if ((rc = make_layout(cmd, "placements", o.positional, m, t, ndim, shape, &l))) goto out;
  size_t need = dtl_layout_visualize_needed(l);
  char *text = need ? malloc(need) : NULL;
  dtl_status st = text ? dtl_layout_visualize(l, text, need) : dtl_layout_visualize(l, (char[1]){0}, 1);
  if (st != DTL_OK) rc = failed(cmd, st);
  else fputs(text, out);
  free(text);
out:
  dtl_layout_destroy(l);
  dtl_mesh_destroy(m);
  return rc;
}

static void print_env(const char *name, const char *what) {
  const char *v = getenv(name);
  fprintf(out, "  %-18s %s\n  %-18s (%s%s%s)\n", name, what, "", v ? "now \"" : "unset", v ? q(v) : "", v ? "\"" : "");
}

static int cmd_info(int argc, char **argv) {
  if (argc > 0) return bad_args("info", "takes no arguments (got \"%s\")", q(argv[0]));
  fprintf(out, "dtl %s (headers %s)\n", dtl_version_string(), DTL_VERSION_STRING);
  fprintf(out, "CUDA/NCCL backend: %s\n", DTL_HAVE_NCCL ? "built (device memory through NCCL)" : "not built (MPI on host memory only)");
  fprintf(out, "default cost models (a collective costs (ring rounds + 1) x alpha + bytes x beta; local steps bytes x local_beta):\n");
  for (int k = 0; k < 2; k++) {
    dtl_cost_model c;
    dtl_cost_model_default(k ? DTL_MEMORY_DEVICE : DTL_MEMORY_HOST, &c);
    fprintf(out, "  %-22s alpha=%g beta=%g local_beta=%g   (%.0f GB/s links, %.0f GB/s local)\n",
           k ? "nccl (device memory)" : "mpi (host memory)", c.alpha_s, c.beta_s_per_byte, c.local_beta_s_per_byte,
           1e-9 / c.beta_s_per_byte, 1e-9 / c.local_beta_s_per_byte);
    fprintf(out, "  %-22s inter_alpha=%g inter_beta=%g   (%.3g GB/s between nodes)\n", "", c.inter_alpha_s,
           c.inter_beta_s_per_byte, 1e-9 / c.inter_beta_s_per_byte);
  }
  fprintf(out, "environment variables read by dtl:\n");
  print_env("DTL_LOG", "log level: error, warn, info or debug (default warn)");
  print_env("DTL_LOG_SUBSYS", "comma list of subsystems to log (default all)");
  print_env("DTL_LOG_FILE", "log to this file instead of stderr (%h: host name, %p: process id)");
  print_env("DTL_CHECK", "1: every collective call (collectives, plans, TP, MoE) first agrees across its ranks on "
                         "the call and each rank's arguments (an error on every rank instead of a hang or wrong "
                         "data); read when a communicator is made");
  print_env("DTL_TIMEOUT", "seconds: every blocking call waits at most this long for its peers, then returns "
                           "DTL_ERR_TIMEOUT and fails the communicator (0 or unset: no deadline); read when a "
                           "communicator is made, the same on every rank");
  print_env("DTL_ALGO", "force MPI collective algorithms, e.g. all_reduce:rs_ag,all_gather:ring (auto: the table's "
                        "choice); read when a communicator is made");
  print_env("DTL_ALGO_TABLE", "file replacing the MPI algorithm table below (same format); read when a communicator "
                              "is made");
  print_env("DTL_RANKS_PER_NODE", "n: simulate nodes of n consecutive ranks (of MPI_COMM_WORLD; NCCL: of the "
                                  "communicator) instead of detecting shared-memory nodes; read when a communicator "
                                  "is made");
  print_env("DTL_PROFILE", "calibration profile (dtl calibrate): its cost line applies before DTL_PLAN_TUNE, its table "
                           "rows replace the MPI algorithm table unless DTL_ALGO_TABLE is set; read when a communicator "
                           "is made and when a plan is created");
  print_env("DTL_PLAN_TUNE", "override the planner's cost model, e.g. alpha=2e-6,beta=2e-10,local_beta=1e-10 "
                             "(also inter_alpha, inter_beta: the link class between nodes)");
  /* Whether DTL_PROFILE and DTL_PLAN_TUNE parse: plan something trivial with them. */
  if (getenv("DTL_PLAN_TUNE") || getenv("DTL_PROFILE")) {
    dtl_mesh *m = NULL;
    dtl_layout *l = NULL;
    dtl_plan *p = NULL;
    dtl_status st = dtl_mesh_create_abstract(1, (int[]){1}, NULL, &m);
    if (st == DTL_OK) st = dtl_layout_create(m, DTL_FLOAT32, 1, (int64_t[]){1}, (dtl_placement[]){dtl_replicate()}, &l);
    if (st == DTL_OK) st = dtl_plan_create(l, l, &p);
    if (st != DTL_OK) fprintf(out, "  warning: DTL_PROFILE or DTL_PLAN_TUNE is invalid, plans will fail: %s\n", dtl_last_error());
    dtl_plan_destroy(p);
    dtl_layout_destroy(l);
    dtl_mesh_destroy(m);
  }
  /* The MPI transport's algorithm table, as a communicator made now would use it. */
  size_t len = 0;
  dtl_status st = dtl_mpi_algorithm_table(NULL, 0, &len);
  char *table = st == DTL_OK ? malloc(len + 1) : NULL;
  if (table) st = dtl_mpi_algorithm_table(table, len + 1, &len);
  if (st != DTL_OK) {
    fprintf(out, "  warning: the MPI algorithm settings are invalid, communicators will fail: %s\n", dtl_last_error());
  } else if (table) {
    fprintf(out, "MPI collective algorithms (class exact: floating sum/prod/avg over 3+ ranks, reduced in rank order by "
            "dtl's algorithms only):\n%s", table);
  }
  free(table);
  return 0;
}

/* dtl calibrate: the one command that initializes MPI (once its arguments parse), over MPI_COMM_WORLD. */
static int cmd_calibrate(int argc, char **argv) {
  const char *path = "dtl.profile";
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--out") && i + 1 < argc && argv[i + 1][0]) path = argv[++i];
    else if (!strcmp(argv[i], "--out")) return bad_args("calibrate", "--out needs a file name");
    else return bad_args("calibrate", "unknown option \"%s\" (expected --out FILE)", q(argv[i]));
  }
  int init = 0, rc = 1;
  MPI_Initialized(&init);
  if (!init && MPI_Init(NULL, NULL) != MPI_SUCCESS) {
    fprintf(err, "dtl calibrate: MPI_Init failed\n");
    return 1;
  }
  dtl_comm *c = NULL;
  dtl_mesh *m = NULL;
  dtl_cost_model model;
  dtl_status st = dtl_comm_from_mpi(MPI_COMM_WORLD, &c);
  int size = dtl_comm_size(c), rank = dtl_comm_rank(c);
  if (st == DTL_OK) st = dtl_mpi_algorithm_calibrate(c); /* first: the mesh's communicators inherit the table */
  if (st == DTL_OK) st = dtl_mesh_create(c, 1, &size, &m);
  if (st == DTL_OK) st = dtl_cost_model_calibrate(m, &model);
  if (st == DTL_OK && rank == 0) st = dtl_cost_model_save(path, m, &model);
  if (st != DTL_OK) rc = failed("calibrate", st);
  else if (rank == 0) {
    fprintf(out, "calibrated on %d ranks (%s):\n  alpha %.3g s  beta %.3g s/B (%.3g GB/s)  local_beta %.3g s/B (%.3g GB/s)\n"
            "  inter_alpha %.3g s  inter_beta %.3g s/B\n", size, dtl_comm_backend_name(c), model.alpha_s,
            model.beta_s_per_byte, 1e-9 / model.beta_s_per_byte, model.local_beta_s_per_byte,
            1e-9 / model.local_beta_s_per_byte, model.inter_alpha_s, model.inter_beta_s_per_byte);
    FILE *f = fopen(path, "r");
    char line[256];
    fprintf(out, "profile %s:\n", q(path));
    while (f && fgets(line, sizeof line, f)) fprintf(out, "  %s", line);
    if (f) fclose(f);
    rc = 0;
  } else {
    rc = 0;
  }
  dtl_mesh_destroy(m);
  dtl_comm_destroy(c);
  if (!init) MPI_Finalize();
  return rc;
}

int dtl_tool_main(int argc, char **argv, FILE *out_stream, FILE *err_stream) {
  out = out_stream;
  err = err_stream;
  if (argc < 2) {
    fputs(usage, err);
    return EXIT_BAD_ARGS;
  }
  const char *c = argv[1];
  if (!strcmp(c, "help") || !strcmp(c, "--help") || !strcmp(c, "-h")) {
    fputs(usage, out);
    return 0;
  }
  for (int i = 2; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(usage, out);
      return 0;
    }
  if (!strcmp(c, "plan")) return cmd_plan(argc - 2, argv + 2);
  if (!strcmp(c, "show")) return cmd_show(argc - 2, argv + 2);
  if (!strcmp(c, "info")) return cmd_info(argc - 2, argv + 2);
  if (!strcmp(c, "calibrate")) return cmd_calibrate(argc - 2, argv + 2);
  return bad_args(NULL, "unknown command \"%s\" (expected plan, show, info, calibrate or help)", q(c));
}
