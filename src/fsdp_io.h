/* fsdp_io.h: data readers, checkpoints and safetensors (src/io/). Part of
 * the public API: included by fsdp.h, read by ffi.lua, FFI-clean like it. */
#ifndef FSDP_IO_API_H
#define FSDP_IO_API_H

#include <stdint.h>

/* ---- pre-tokenised token files (src/io/token_file.c) ----------------- */
/* Formats (docs/DATA.md): AUTO reads the llm.c header (256 x int32: magic,
 * version, token count; magic 20240520 version 1: uint16 tokens, magic
 * 20240801 version 7: uint32 tokens) and rejects anything else; RAW_U16 and
 * RAW_U32 take the whole file as headerless tokens (nanoGPT's train.bin is
 * RAW_U16). Little-endian files, memory-mapped read-only. */
typedef enum { FSDP_TOKENS_AUTO = 0, FSDP_TOKENS_RAW_U16 = 1, FSDP_TOKENS_RAW_U32 = 2 } fsdp_token_format;
typedef struct fsdp_token_file fsdp_token_file;

int fsdp_token_file_open(const char *path, int32_t format, fsdp_token_file **out);
int64_t fsdp_token_file_count(const fsdp_token_file *f);   /* tokens; 0 for NULL */
int32_t fsdp_token_file_width(const fsdp_token_file *f);   /* bytes per token: 2 or 4; 0 for NULL */
/* out[i] = token start + i for i < n, widened to int32; a uint32 token above
 * INT32_MAX is an error (FSDP_EINVAL), as is a range outside [0, count). */
int fsdp_token_file_read(const fsdp_token_file *f, int64_t start, int64_t n, int32_t *out);
void fsdp_token_file_close(fsdp_token_file *f);            /* NULL: no-op */

#endif /* FSDP_IO_API_H */
