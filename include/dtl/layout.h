/* SPDX-License-Identifier: Apache-2.0 */
/* Placements and layouts: where each piece of a global tensor lives on a mesh. A layout is a mesh, a
 * dtype, a global shape and one placement per mesh dim. Uneven sizes follow torch.chunk: a tensor dim of
 * size n split k ways gives chunks of ceil(n/k); trailing chunks may be smaller or empty. Several mesh
 * dims sharding one tensor dim split it left to right (mesh dim 0 first, then its local chunk). */
#ifndef DTL_LAYOUT_H
#define DTL_LAYOUT_H

#include "dtl/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DTL_REPLICATE = 0, DTL_SHARD = 1, DTL_PARTIAL = 2 } dtl_placement_kind;
/* dim is used by DTL_SHARD (negative counts from the end of the tensor's dims); op by DTL_PARTIAL. */
typedef struct { dtl_placement_kind kind; int dim; dtl_reduce_op op; } dtl_placement;

/* Convenience constructors. */
DTL_API dtl_placement dtl_shard(int dim);
DTL_API dtl_placement dtl_replicate(void);
DTL_API dtl_placement dtl_partial(dtl_reduce_op op);

/* Parses a comma list such as "S(0),R", "S0, S1", "P", "P(avg)", "R,P(max)". Entries: R, S(d) or Sd
 * (d an int, may be negative; its range is checked by dtl_layout_create), P (= P(sum)) or P(op) with op
 * sum, prod, max, min or avg; blanks around entries are ignored. Writes *count entries into out (at most
 * max >= 1); a list longer than max, or malformed text (empty entries and stray commas included), is
 * DTL_ERR_INVALID_ARGUMENT with a message naming the entry and its offset, and writes nothing. */
DTL_API dtl_status dtl_placements_parse(const char *text, dtl_placement *out, int max, int *count);
/* Writes "S(0),R,P(sum)". If cap is too small: DTL_ERR_INVALID_ARGUMENT and the message names the size needed. */
DTL_API dtl_status dtl_placements_format(const dtl_placement *p, int count, char *buf, size_t cap);

typedef struct dtl_layout dtl_layout;

/* placements has dtl_mesh_ndim(m) entries. Shard dims are normalised (negative -> from the end) and must
 * be in range; Partial ops must suit the dtype (DTL_ERR_UNSUPPORTED: P(avg) on an integer dtype; on the 8-bit floats
 * P(sum), P(prod) and P(avg), which would round at every step, and P(max)/P(min) on a mesh whose transport cannot
 * reduce them, types.h); global dims >= 0 (zero allowed); the element count and the
 * byte size must fit in int64_t and size_t. The layout keeps a reference to m. */
DTL_API dtl_status dtl_layout_create(const dtl_mesh *m, dtl_dtype t, int ndim, const int64_t *global_shape,
                                     const dtl_placement *placements, dtl_layout **out);
/* Same mesh, dtype and shape as l with other placements. */
DTL_API dtl_status dtl_layout_with_placements(const dtl_layout *l, const dtl_placement *placements, dtl_layout **out);
/* The local shard of the rank at coord (NULL = this rank): its shape and its offset in the global tensor.
 * shape and offset are optional outputs (either one alone may be asked for). */
DTL_API dtl_status dtl_layout_local_box(const dtl_layout *l, const int *coord, int64_t *shape, int64_t *offset);
/* Number of elements of this rank's local shard (its buffer is row-major and contiguous). */
DTL_API size_t dtl_layout_local_count(const dtl_layout *l);
DTL_API size_t dtl_layout_global_count(const dtl_layout *l);
DTL_API const dtl_mesh *dtl_layout_mesh(const dtl_layout *l);
DTL_API dtl_dtype dtl_layout_dtype(const dtl_layout *l);
DTL_API int dtl_layout_ndim(const dtl_layout *l);
DTL_API void dtl_layout_global_shape(const dtl_layout *l, int64_t *shape);
/* Normalised placements (shard dims non-negative), one per mesh dim. */
DTL_API void dtl_layout_placements(const dtl_layout *l, dtl_placement *out);
/* One line, "f32[8,6] mesh=2x4 placements=S(0),R" (normalised placements), for messages and tools. If cap
 * is too small: DTL_ERR_INVALID_ARGUMENT, nothing written, and the message names the size needed. */
DTL_API dtl_status dtl_layout_format(const dtl_layout *l, char *buf, size_t cap);
/* Draws which mesh coordinates hold which block of a 1-D or 2-D tensor as a text grid: a header (the
 * dtl_layout_format line), one line per Partial mesh dim, a table whose rows (1-D: index ranges; 2-D:
 * row ranges x column ranges) are the distinct non-empty blocks, each cell naming the coordinate that
 * holds it (with * on the mesh dims that do not shard) and the ranks, then the empty shards. The text
 * depends on the layout only (not on the calling rank) and works on abstract meshes. 0-d and 3-d or
 * larger tensors, and meshes over 65536 ranks, are DTL_ERR_UNSUPPORTED. If cap is too small:
 * DTL_ERR_INVALID_ARGUMENT, nothing written, and the message names the size needed, which
 * dtl_layout_visualize_needed also returns (bytes including the terminating NUL; 0 when l is invalid or
 * cannot be drawn). */
DTL_API dtl_status dtl_layout_visualize(const dtl_layout *l, char *buf, size_t cap);
DTL_API size_t dtl_layout_visualize_needed(const dtl_layout *l);
DTL_API void dtl_layout_destroy(dtl_layout *l);

#ifdef __cplusplus
}
#endif
#endif
