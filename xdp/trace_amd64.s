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

// func traceClockCPU() (int64, int32): the time-stamp counter and the CPU
// (RDTSCP: Linux keeps the CPU number in TSC_AUX's low 12 bits).
TEXT ·traceClockCPU(SB),NOSPLIT,$0-12
	RDTSCP
	SHLQ $32, DX
	ORQ DX, AX
	MOVQ AX, ret+0(FP)
	ANDL $0xfff, CX
	MOVL CX, ret1+8(FP)
	RET
