/* pool.h: bounded, stream-ordered pool of full-unit buffers (see pool.c). */
#ifndef FSDP_SHARD_POOL_H
#define FSDP_SHARD_POOL_H

#include "../fsdp_shard.h"

/* 0: the slot and pointer are taken, and `user` will wait for the buffer's previous user;
 * 1: every buffer is live (the bound); < 0: error. */
int fsdp_pool_acquire(fsdp_pool *p, size_t bytes, fsdp_stream *user, int *slot, void **ptr);
/* The buffer is free once the work enqueued on last_user so far is done. */
int fsdp_pool_give_back(fsdp_pool *p, int slot, fsdp_stream *last_user);
/* Counted references (a unit holds its pools): the last release frees. */
void fsdp_pool_retain(fsdp_pool *p);
void fsdp_pool_release(fsdp_pool *p);

#endif
