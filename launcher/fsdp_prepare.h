/* fsdp_prepare.h: `fsdp prepare ...` (launcher/fsdp_prepare.c). */
#ifndef FSDP_PREPARE_H
#define FSDP_PREPARE_H

/* argv[1] is "prepare": runs scripts/prepare_data.py with argv[2..] in the
 * project's Python environment. Returns only when it cannot (an exit
 * status, the reason printed); otherwise the process becomes the tool. */
int fsdp_prepare_main(int argc, char **argv);

#endif
