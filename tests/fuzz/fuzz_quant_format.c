/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target of quantized formats on abstract meshes: the input picks a format description (any kind, mask,
 * flags and field values, valid or not), a logical shape, a mesh (1-2 dims of 1-6), a coordinate and placements, then
 * dequantizes and quantizes parts made of its own bytes. A bad description must be refused cleanly; a layout made
 * must give every coordinate part boxes inside the parts' global shapes whose bytes match; dequantizing arbitrary
 * bytes must succeed or be refused (a NaN/Inf scale, a g_idx out of range) with the output untouched; quantizing
 * arbitrary floats must succeed or be refused. Nothing may crash. */
#include "fuzz_input.h"

enum { MAX_ELEMS = 1 << 16 };

static int64_t fz_extent(fz_in *in) {
  unsigned b = fz_byte(in);
  if (b >= 0xfc) return (int64_t)(int32_t)fz_u64(in); /* anything, negative included */
  if (b >= 0xf0) return 256 * (1 + (b & 3));            /* GGUF super-blocks */
  return b % 72;
}

static int64_t fz_field(fz_in *in) {
  unsigned b = fz_byte(in);
  static const int64_t common[] = {1, 3, 7, 8, 16, 32, 64, 128, -1, 0};
  if (b < 0xf0) return common[b % 10];
  return (int64_t)fz_u64(in);
}

static const dtl_status refusals[] = {DTL_ERR_INVALID_ARGUMENT, DTL_OK};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in in = {data, size};
  dtl_quant_format f = {0};
  unsigned kb = fz_byte(&in);
  f.kind = kb >= 0xf8 ? (dtl_quant_kind)(int8_t)fz_byte(&in) : (dtl_quant_kind)(kb % DTL_QUANT_NUM_KINDS);
  f.mask = fz_byte(&in) & 0x1f;
  if (fz_byte(&in) >= 0xf8) f.mask = fz_u64(&in);
  f.flags = fz_byte(&in) >= 0xf0 ? fz_u64(&in) : fz_byte(&in) & 1;
  f.block_rows = fz_field(&in);
  f.block_cols = fz_field(&in);
  f.group = fz_field(&in);
  f.code_dtype = (dtl_dtype)(fz_byte(&in) % 12);
  f.scale_dtype = (dtl_dtype)(fz_byte(&in) % 12);
  int nd = fz_below(&in, 6);
  int64_t shape[8];
  for (int d = 0; d < nd; d++) shape[d] = fz_extent(&in);
  int M = 1 + fz_below(&in, 2), mshape[2], coord[2];
  for (int m = 0; m < M; m++) mshape[m] = 1 + fz_below(&in, 6);
  for (int m = 0; m < M; m++) coord[m] = fz_below(&in, mshape[m]);
  dtl_placement pl[2];
  for (int m = 0; m < M; m++) pl[m] = fz_placement(&in, nd > 0 ? nd : 1);

  dtl_mesh *mesh = NULL;
  FZ_CHECK(dtl_mesh_create_abstract(M, mshape, coord, &mesh) == DTL_OK, "mesh: %s", dtl_last_error());
  dtl_qlayout *l = (dtl_qlayout *)0x1;
  dtl_status st = dtl_qlayout_create(mesh, &f, nd, shape, pl, &l);
  if (st != DTL_OK) {
    FZ_FAILED(st, "dtl_qlayout_create", DTL_ERR_INVALID_ARGUMENT);
    FZ_CHECK(l == (dtl_qlayout *)0x1, "a failed create wrote the layout");
    dtl_mesh_destroy(mesh);
    return 0;
  }
  char text[512];
  FZ_CHECK(dtl_qlayout_format(l, text, sizeof text) == DTL_OK, "format: %s", dtl_last_error());
  /* every coordinate's boxes lie inside the parts and count their bytes */
  for (int c0 = 0; c0 < mshape[0]; c0++)
    for (int c1 = 0; c1 < (M > 1 ? mshape[1] : 1); c1++) {
      dtl_qbox b;
      FZ_CHECK(dtl_qlayout_local_boxes(l, (int[]){c0, c1}, &b) == DTL_OK, "boxes: %s", dtl_last_error());
      for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
        const dtl_qpart_box *pb = &b.part[p];
        if (pb->ndim < 0) continue;
        size_t n = dtl_dtype_size(pb->dtype);
        for (int d = 0; d < pb->ndim; d++) {
          FZ_CHECK(pb->offset[d] >= 0 && pb->shape[d] >= 0 && pb->offset[d] + pb->shape[d] <= pb->global_shape[d],
                   "%s part %d dim %d: box %lld@%lld outside %lld", text, p, d, (long long)pb->shape[d],
                   (long long)pb->offset[d], (long long)pb->global_shape[d]);
          n *= (size_t)pb->shape[d];
        }
        FZ_CHECK(n == pb->bytes, "%s part %d: %zu bytes, box %zu", text, p, pb->bytes, n);
      }
    }
  /* dequantize and quantize this rank's shard, if it is small */
  dtl_qbox b;
  dtl_qlayout_local_boxes(l, NULL, &b);
  size_t total = 0, count = dtl_layout_local_count(dtl_qlayout_logical(l));
  for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) total += b.part[p].ndim >= 0 ? b.part[p].bytes : 0;
  if (total <= MAX_ELEMS && count <= MAX_ELEMS) {
    dtl_qbuf q = {{NULL}};
    for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) {
      if (b.part[p].ndim < 0) continue;
      q.part[p] = malloc(b.part[p].bytes + 1);
      FZ_CHECK(q.part[p] != NULL, "malloc");
      for (size_t i = 0; i < b.part[p].bytes; i++) ((uint8_t *)q.part[p])[i] = (uint8_t)(fz_byte(&in) ^ (i * 131));
    }
    float *out = malloc(count * sizeof *out + 4);
    FZ_CHECK(out != NULL, "malloc");
    memset(out, 0x5a, count * sizeof *out);
    st = dtl_quant_dequantize(l, &q, out);
    if (st != DTL_OK) {
      fz_failed(st, "dtl_quant_dequantize", refusals);
      for (size_t i = 0; i < count * sizeof *out; i++)
        FZ_CHECK(((uint8_t *)out)[i] == 0x5a, "a failed dequantize wrote its output");
    }
    for (size_t i = 0; i < count; i++) out[i] = (float)(int8_t)fz_byte(&in) * 0.25f;
    if (count) out[fz_byte(&in) % count] = (float)fz_double(&in);
    st = dtl_quant_quantize(l, out, &q);
    if (st != DTL_OK)
      FZ_FAILED(st, "dtl_quant_quantize", DTL_ERR_INVALID_ARGUMENT, DTL_ERR_UNSUPPORTED);
    else {
      float *back = malloc(count * sizeof *back + 4);
      FZ_CHECK(back != NULL, "malloc");
      FZ_CHECK(dtl_quant_dequantize(l, &q, back) == DTL_OK, "%s: its own quantization does not dequantize: %s", text,
               dtl_last_error());
      free(back);
    }
    free(out);
    for (int p = 0; p < DTL_QUANT_NUM_PARTS; p++) free(q.part[p]);
  }
  dtl_qlayout *w = NULL;
  st = dtl_qlayout_with_placements(l, pl, &w);
  FZ_CHECK(st == DTL_OK, "with_placements of its own placements: %s", dtl_last_error());
  dtl_qlayout_destroy(w);
  dtl_qlayout_destroy(l);
  dtl_mesh_destroy(mesh);
  return 0;
}
