//go:build xmxtrace

#include "textflag.h"

// func traceClock() int64: the time-stamp counter (RDTSC, not serializing:
// a few nanoseconds, against tens for the clock).
TEXT ·traceClock(SB),NOSPLIT,$0-8
	RDTSC
	SHLQ $32, DX
	ORQ DX, AX
	MOVQ AX, ret+0(FP)
	RET
