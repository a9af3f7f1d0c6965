#include "textflag.h"

// rt0: prctl(PR_SET_DUMPABLE, 0), then Go's own entry point (see rt0.go).
TEXT ·rt0(SB),NOSPLIT|NOFRAME,$0
	MOVQ	$157, AX // SYS_prctl
	MOVQ	$4, DI   // PR_SET_DUMPABLE
	XORQ	SI, SI   // SUID_DUMP_DISABLE
	SYSCALL
	JMP	_rt0_amd64_linux(SB)
