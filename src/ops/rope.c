/* rope.c: rotary position embeddings exactly as Hugging Face's Llama applies
 * them (rotate-half convention): element j < d/2 of a head pairs with
 * element j + d/2, both rotated by pos * inv_freq[j]:
 *   a' = a cos - b sin,  b' = b cos + a sin.
 * inv_freq[j] = 1 / theta^(2j/d), computed in fp32 as transformers does
 * (so the frequencies agree bit for bit), optionally rescaled by Llama-3's
 * rule; the angle and its cos/sin in double. The table is [seq, d] with
 * the d/2 values repeated, like HF's cat(freqs, freqs). */
#include <math.h>

#include "../base/error.h"
#include "../fsdp_ops.h"

int fsdp_rope_table(float *cos_t, float *sin_t, int64_t seq, int64_t head_dim, double theta,
                    const fsdp_rope_scaling *sc) {
  if (seq < 0 || head_dim < 2 || head_dim % 2 || !(theta > 0) || (seq && (!cos_t || !sin_t)))
    return fsdp_fail(FSDP_EINVAL, "rope_table: seq=%lld head_dim=%lld (must be even) theta=%g", (long long)seq,
                     (long long)head_dim, theta);
  if (sc && (!(sc->factor > 0) || !(sc->high_freq_factor > sc->low_freq_factor) || sc->original_max_position_embeddings < 1))
    return fsdp_fail(FSDP_EINVAL, "rope_table: llama3 scaling needs factor > 0, high_freq_factor > low_freq_factor and "
                     "original_max_position_embeddings >= 1");
  int64_t h = head_dim / 2;
  for (int64_t j = 0; j < h; j++) {
    float inv = 1.0f / powf((float)theta, (float)(2 * j) / (float)head_dim);
    if (sc) {
      const double pi = 3.14159265358979323846;
      double orig = (double)sc->original_max_position_embeddings;
      double wavelen = 2 * pi / inv;
      double low_wl = orig / sc->low_freq_factor, high_wl = orig / sc->high_freq_factor;
      if (wavelen > low_wl) {
        inv = inv / sc->factor;
      } else if (wavelen >= high_wl) { /* between: interpolate */
        double s = (orig / wavelen - sc->low_freq_factor) / (sc->high_freq_factor - sc->low_freq_factor);
        inv = (float)((1 - s) * inv / sc->factor + s * inv);
      }
    }
    for (int64_t p = 0; p < seq; p++) {
      double a = (double)p * (double)inv;
      float c = (float)cos(a), s = (float)sin(a);
      cos_t[p * head_dim + j] = cos_t[p * head_dim + j + h] = c;
      sin_t[p * head_dim + j] = sin_t[p * head_dim + j + h] = s;
    }
  }
  return FSDP_OK;
}

/* sign +1: forward rotation; -1: its transpose (the backward). Row (b, t)
 * of x turns by table row pos[b, t] (pos NULL: t) */
static int rotate(const char *op, float *x, const float *cos_t, const float *sin_t, const int32_t *pos, int64_t batch,
                  int64_t seq, int64_t heads, int64_t d, float sign) {
  if (batch < 0 || seq < 0 || heads < 1 || d < 2 || d % 2)
    return fsdp_fail(FSDP_EINVAL, "%s: batch=%lld seq=%lld heads=%lld head_dim=%lld (must be even)", op, (long long)batch,
                     (long long)seq, (long long)heads, (long long)d);
  if (batch && seq && (!x || !cos_t || !sin_t)) return fsdp_fail(FSDP_EINVAL, "%s: NULL buffer", op);
  if (pos)
    for (int64_t i = 0; i < batch * seq; i++)
      if (pos[i] < 0 || pos[i] >= seq)
        return fsdp_fail(FSDP_EINVAL, "%s: position %d at row %lld, %lld is outside the table's [0, %lld)", op, pos[i],
                         (long long)(i / seq), (long long)(i % seq), (long long)seq);
  int64_t h = d / 2;
  for (int64_t b = 0; b < batch; b++)
    for (int64_t t = 0; t < seq; t++) {
      const int64_t p = pos ? pos[b * seq + t] : t;
      const float *c = cos_t + p * d, *s = sin_t + p * d;
      for (int64_t hd = 0; hd < heads; hd++) {
        float *v = x + ((b * seq + t) * heads + hd) * d;
        for (int64_t j = 0; j < h; j++) {
          float a = v[j], bb = v[j + h], sn = sign * s[j];
          v[j] = a * c[j] - bb * sn;
          v[j + h] = bb * c[j] + a * sn;
        }
      }
    }
  return FSDP_OK;
}

int fsdp_rope_forward(float *x, const float *cos_t, const float *sin_t, int64_t batch, int64_t seq, int64_t heads,
                      int64_t head_dim) {
  return rotate("rope_forward", x, cos_t, sin_t, NULL, batch, seq, heads, head_dim, 1.0f);
}

int fsdp_rope_backward(float *dx, const float *cos_t, const float *sin_t, int64_t batch, int64_t seq, int64_t heads,
                       int64_t head_dim) {
  return rotate("rope_backward", dx, cos_t, sin_t, NULL, batch, seq, heads, head_dim, -1.0f);
}

int fsdp_rope_forward_at(float *x, const float *cos_t, const float *sin_t, const int32_t *pos, int64_t batch, int64_t seq,
                         int64_t heads, int64_t head_dim) {
  if (!pos && batch && seq) return fsdp_fail(FSDP_EINVAL, "rope_forward_at: pos is NULL");
  return rotate("rope_forward_at", x, cos_t, sin_t, pos, batch, seq, heads, head_dim, 1.0f);
}

int fsdp_rope_backward_at(float *dx, const float *cos_t, const float *sin_t, const int32_t *pos, int64_t batch,
                          int64_t seq, int64_t heads, int64_t head_dim) {
  if (!pos && batch && seq) return fsdp_fail(FSDP_EINVAL, "rope_backward_at: pos is NULL");
  return rotate("rope_backward_at", dx, cos_t, sin_t, pos, batch, seq, heads, head_dim, -1.0f);
}
