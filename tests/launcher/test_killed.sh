#!/usr/bin/env bash
# A rank killed by a signal ends the job: fsdprun exits 128+signal within
# 5 s naming the rank and the signal; nothing is left behind.
. "$(dirname "$0")/lib.sh"

fail_case "rank 2 SIGKILLed" 137 '^fsdprun: rank 2 was killed by signal 9 \(Killed\); stopping the other 3 ranks$' 5000 \
  -n 4 --host "$PROBE" --kill-self 9 --rank-to-fail 2 --sleep 60 --grandchild --marker $MARK

fail_case "rank 0 SIGSEGV" 139 '^fsdprun: rank 0 was killed by signal 11 \(Segmentation fault\)' 5000 \
  -n 2 --host "$PROBE" --kill-self 11 --rank-to-fail 0 --sleep 60 --marker $MARK

finish
