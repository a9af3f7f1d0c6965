#include "textflag.h"

// rt0: prctl(PR_SET_DUMPABLE, 0), then Go's own entry point (see rt0.go).
TEXT ·rt0(SB),NOSPLIT|NOFRAME,$0
	MOVD	$167, R8 // SYS_prctl
	MOVD	$4, R0   // PR_SET_DUMPABLE
	MOVD	$0, R1   // SUID_DUMP_DISABLE
	SVC
	JMP	_rt0_arm64_linux(SB)
