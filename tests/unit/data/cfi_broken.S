/* CFI qmpprof must refuse function by function, for test_cfi_instructions.py:
   `unknown_opcode` uses DW_CFA 0x3f (no such instruction), `no_cfa_register` has a
   CIE without initial instructions and sets only the CFA offset, never its register.
   `fine` between them must unwind as usual. */
	.text
	.globl _start
_start:
unknown_opcode:
	.cfi_startproc
	push %rbp
	.cfi_def_cfa_offset 16
	.cfi_escape 0x3f
	nop
	pop %rbp
	ret
	.cfi_endproc

fine:
	.cfi_startproc
	push %rbp
	.cfi_def_cfa_offset 16
	.cfi_offset %rbp, -16
	nop
	pop %rbp
	.cfi_def_cfa_offset 8
	ret
	.cfi_endproc

no_cfa_register:
	.cfi_startproc simple
	.cfi_offset %rip, -8
	push %rbp
	.cfi_def_cfa_offset 16
	nop
	pop %rbp
	ret
	.cfi_endproc
