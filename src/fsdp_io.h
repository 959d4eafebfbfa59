/* fsdp_io.h: the io layer's API (src/io/): token files, checksums and
 * durable file steps, checkpoints, safetensors. Part of the public API:
 * included by fsdp.h, read by ffi.lua, FFI-clean like it. */
#ifndef FSDP_IO_API_H
#define FSDP_IO_API_H

#include "fsdp_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- pre-tokenised token files (src/io/token_file.c) ----------------- */
/* Formats (docs/TRAINING.md, "The data"): AUTO reads the llm.c header (256 x int32: magic,
 * version, token count; magic 20240520 version 1: uint16 tokens, magic
 * 20240801 version 7: uint32 tokens) and rejects anything else; RAW_U16 and
 * RAW_U32 take the whole file as headerless tokens (nanoGPT's train.bin is
 * RAW_U16); RAW_U8, one byte each (`fsdp prepare --chat`'s loss masks).
 * Little-endian files, memory-mapped read-only. */
typedef enum { FSDP_TOKENS_AUTO = 0, FSDP_TOKENS_RAW_U16 = 1, FSDP_TOKENS_RAW_U32 = 2, FSDP_TOKENS_RAW_U8 = 3 } fsdp_token_format;
typedef struct fsdp_token_file fsdp_token_file;

int fsdp_token_file_open(const char *path, int32_t format, fsdp_token_file **out);
int64_t fsdp_token_file_count(const fsdp_token_file *f);   /* tokens; 0 for NULL */
int32_t fsdp_token_file_width(const fsdp_token_file *f);   /* bytes per token: 1, 2 or 4; 0 for NULL */
/* out[i] = token start + i for i < n, widened to int32; a uint32 token above
 * INT32_MAX is an error (FSDP_EINVAL), as is a range outside [0, count). */
int fsdp_token_file_read(const fsdp_token_file *f, int64_t start, int64_t n, int32_t *out);
/* FSDP_EINVAL naming the first token >= vocab (its index and byte offset in
 * the file) when there is one: one vectorised pass over the mapped file. */
int fsdp_token_file_check_ids(const fsdp_token_file *f, int64_t vocab);
int fsdp_token_file_close(fsdp_token_file *f);             /* NULL: no-op */

/* ---- checksums and durable file steps (src/io/crc32c.c, sha256.c, fs.c) */
/* CRC-32C (Castagnoli) of n bytes continuing from crc (start with 0);
 * the portable table version gives the same values without SSE4.2. */
uint32_t fsdp_crc32c(uint32_t crc, const void *data, size_t n);
uint32_t fsdp_crc32c_portable(uint32_t crc, const void *data, size_t n);
/* SHA-256 as 64 lowercase hex digits plus NUL into hex (65 bytes): of n
 * bytes, or of a whole file (src/io/sha256.c; a token file's manifest
 * records its tokenizer.json's, checked against the model's folder). */
int fsdp_sha256(const void *data, size_t n, char *hex);
int fsdp_sha256_file(const char *path, char *hex);
int fsdp_fs_mkdirs(const char *path);                 /* mkdir -p */
int fsdp_fs_remove_tree(const char *path);            /* rm -r; a missing path is fine */
int fsdp_fs_rename(const char *from, const char *to); /* then fsyncs to's directory */
int fsdp_fs_fsync(const char *path);
/* path.tmp written, fsynced, renamed over path: readers see old or new, whole */
int fsdp_fs_write_atomic(const char *path, const void *data, size_t n);
int fsdp_fs_create(const char *path, int64_t bytes);  /* a new file of that size (zeros) */
int fsdp_fs_pwrite(const char *path, int64_t offset, const void *data, size_t n);
/* FSDP_OK and *bytes, *is_dir (either may be NULL) when path exists;
 * FSDP_ABSENT when it does not; an error otherwise */
int fsdp_fs_stat(const char *path, int64_t *bytes, int *is_dir);
/* dir's entries, each followed by '\n', into buf (cap bytes); returns the
 * bytes needed (0 for a missing dir); call again with more when above cap */
int64_t fsdp_fs_list(const char *dir, char *buf, int64_t cap);

/* ---- one job per directory (src/io/dir_lock.c) ------------------------ */
/* An exclusive advisory lock (fcntl) on path, created when missing, held
 * until fsdp_dir_lock_release or the process ends (the kernel releases it:
 * a crash leaves none). *fd: its descriptor. FSDP_EBUSY when another process
 * holds it: holder (cap bytes; may be NULL) gets the file's text, what the
 * holder wrote there. */
int fsdp_dir_lock_take(const char *path, int *fd, char *holder, size_t cap);
/* The file's text (what its last holder wrote), NUL-terminated in buf. */
int fsdp_dir_lock_read(int fd, char *buf, size_t cap);
/* Replaces the file's text, durably (fsync). */
int fsdp_dir_lock_write(int fd, const char *text);
int fsdp_dir_lock_release(int fd);

/* ---- checkpoints (src/io/ckpt_writer.c, ckpt_reader.c; docs/CHECKPOINTS.md) */
typedef struct fsdp_ckpt_writer fsdp_ckpt_writer;
/* Writes segments bufs[i] (bytes[i] each) into a new file at path, each at a
 * multiple of 64 bytes, with each segment's CRC-32C, then fsyncs it: on a
 * background thread. The buffers must stay alive and unchanged until
 * finish returns. */
int fsdp_ckpt_writer_start(const char *path, int n, const void *const *bufs, const int64_t *bytes,
                           fsdp_ckpt_writer **out);
int fsdp_ckpt_writer_done(const fsdp_ckpt_writer *w); /* 1 once the thread has finished */
/* Waits for the thread; on success fills offsets[n], crcs[n] and the file's
 * size. Frees w either way; returns the write's status. */
int fsdp_ckpt_writer_finish(fsdp_ckpt_writer *w, int64_t *offsets, uint32_t *crcs, int64_t *file_bytes);
/* A test hook: the next writer started kills this process (SIGKILL) once it
 * has written that many bytes (-1: off). */
void fsdp_ckpt_writer_fault(int64_t kill_after_bytes);

typedef struct fsdp_ckpt fsdp_ckpt;
/* Opens a checkpoint directory: index.json checked against index.sum and
 * parsed, every file present with its size, every state of every tensor
 * covered by segments exactly once. FSDP_ECORRUPT names what is wrong. */
int fsdp_ckpt_open(const char *dir, fsdp_ckpt **out);
int fsdp_ckpt_close(fsdp_ckpt *c);
int fsdp_ckpt_tensor_count(const fsdp_ckpt *c);
/* name stays valid until close; shape has room for 8 */
int fsdp_ckpt_tensor_info(const fsdp_ckpt *c, int i, const char **name, int *ndim, int64_t *shape);
int fsdp_ckpt_has_state(const fsdp_ckpt *c, const char *state); /* 1 or 0 */
/* A number or string of the index's "meta" object at a dotted path
 * ("train.step"): FSDP_OK when found, FSDP_ABSENT when missing or of
 * another type. */
int fsdp_ckpt_meta_number(const fsdp_ckpt *c, const char *key, double *out);
int fsdp_ckpt_meta_string(const fsdp_ckpt *c, const char *key, char *buf, int64_t cap);
/* Elements [begin, end) of a tensor's state ("param", "exp_avg", ...) into
 * dst, from the segments holding them, each verified against its CRC-32C
 * before use. */
int fsdp_ckpt_read(fsdp_ckpt *c, const char *tensor, const char *state, int64_t begin, int64_t end, float *dst);

/* ---- safetensors (src/io/safetensors.c) ------------------------------ */
typedef struct fsdp_safetensors fsdp_safetensors;
typedef struct fsdp_safetensors_entry {
  const char *name, *dtype; /* "F32", "BF16", ...; valid until close */
  int32_t ndim, pad;
  int64_t shape[8];
  int64_t begin, end; /* the tensor's bytes in the file (absolute offsets) */
} fsdp_safetensors_entry;
/* Opens and checks a file's header (the data is read by _read). Malformed
 * headers fail with FSDP_ECORRUPT naming the file and the fault. */
int fsdp_safetensors_open(const char *path, fsdp_safetensors **out);
/* The same checks on a file held in memory (n bytes available of a file of
 * file_bytes); what names it in messages. For the fuzzer and tests. */
int fsdp_safetensors_parse(const void *file, size_t n, int64_t file_bytes, const char *what, fsdp_safetensors **out);
int fsdp_safetensors_close(fsdp_safetensors *st);
int fsdp_safetensors_count(const fsdp_safetensors *st);
/* FSDP_OK and *index of the tensor called name; FSDP_ABSENT if none is */
int fsdp_safetensors_find(const fsdp_safetensors *st, const char *name, int *index);
int fsdp_safetensors_entry_get(const fsdp_safetensors *st, int i, fsdp_safetensors_entry *out);
const char *fsdp_safetensors_metadata(const fsdp_safetensors *st, const char *key); /* NULL: none */
/* Elements [begin, end) of tensor i as fp32 (from F64, F32, F16, BF16) */
int fsdp_safetensors_read(fsdp_safetensors *st, int i, int64_t begin, int64_t end, float *dst);
/* The header (length prefix, JSON padded with spaces to 8 bytes) of a file
 * holding n tensors back to back in the given order (shapes: n x 8),
 * __metadata__ from nmeta key/value pairs. Returns its size in bytes; writes
 * it when cap suffices; data_begin[i] (may be NULL): where tensor i's bytes
 * start in the file. */
int64_t fsdp_safetensors_header(int n, const char *const *names, const char *const *dtypes, const int32_t *ndims,
                                const int64_t *shapes, int nmeta, const char *const *meta, char *buf, int64_t cap,
                                int64_t *data_begin);

#ifdef __cplusplus
}
#endif
#endif /* FSDP_IO_API_H */
