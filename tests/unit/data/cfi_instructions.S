/* Every DW_CFA_* instruction in hand-written CFI, for test_cfi_instructions.py.
   gas has directives for some; the others are spelled out with .cfi_escape.
   Operands are single-byte LEB128 numbers; data alignment is -8, code alignment 1.
   Built with -DBOTH_SECTIONS, gas also writes the same CFI to .debug_frame. */
#ifdef BOTH_SECTIONS
	.cfi_sections .eh_frame, .debug_frame
#endif
	.text
	.globl _start
_start:
	.cfi_startproc
	push %rbp
	.cfi_def_cfa_offset 16
	.cfi_offset %rbp, -16
	nop
	.cfi_escape 0x05, 3, 3          /* DW_CFA_offset_extended rbx, 3 * -8 */
	nop
	.cfi_escape 0x11, 12, 0x7c      /* DW_CFA_offset_extended_sf r12, -4 * -8 */
	nop
	.cfi_escape 0x14, 13, 2         /* DW_CFA_val_offset r13, 2 * -8 */
	nop
	.cfi_escape 0x15, 14, 0x7f      /* DW_CFA_val_offset_sf r14, -1 * -8 */
	nop
	.cfi_escape 0x06, 3             /* DW_CFA_restore_extended rbx */
	.cfi_restore %rbp               /* DW_CFA_restore */
	nop
	.cfi_undefined %r15             /* DW_CFA_undefined */
	.cfi_same_value %r12            /* DW_CFA_same_value */
	.cfi_register %rbx, %r9         /* DW_CFA_register */
	nop
	.cfi_escape 0x12, 6, 0x7e       /* DW_CFA_def_cfa_sf rbp, -2 * -8 */
	nop
	.cfi_escape 0x13, 0x7d          /* DW_CFA_def_cfa_offset_sf -3 * -8 */
	nop
	.cfi_escape 0x2e, 0x10          /* DW_CFA_GNU_args_size 16 */
	nop
	.cfi_remember_state             /* DW_CFA_remember_state */
	.cfi_def_cfa %rsp, 8            /* DW_CFA_def_cfa */
	.cfi_offset %rbx, -48
	nop
	.cfi_restore_state              /* DW_CFA_restore_state */
	nop
	.cfi_escape 0x0f, 2, 0x77, 8    /* DW_CFA_def_cfa_expression: DW_OP_breg7 8 */
	nop
	.cfi_escape 0x10, 6, 2, 0x76, 0 /* DW_CFA_expression rbp: DW_OP_breg6 0 */
	.cfi_escape 0x16, 3, 2, 0x76, 8 /* DW_CFA_val_expression rbx: DW_OP_breg6 8 */
	nop
	.cfi_def_cfa_register %rbp      /* DW_CFA_def_cfa_register, after an expression */
	nop
	.cfi_escape 0x00                /* DW_CFA_nop */
	.cfi_escape 0x2f, 12, 2         /* DW_CFA_GNU_negative_offset_extended r12, -(2 * -8) */
	.cfi_escape 0x2d                /* DW_CFA_GNU_window_save: no x86-64 state */
	nop
	.fill 100, 1, 0x90              /* DW_CFA_advance_loc1 */
	.cfi_adjust_cfa_offset 8
	.fill 300, 1, 0x90              /* DW_CFA_advance_loc2 */
	.cfi_adjust_cfa_offset 8
	.fill 70000, 1, 0x90            /* DW_CFA_advance_loc4 */
	.cfi_adjust_cfa_offset 8
	ret
	.cfi_endproc

/* A CIE of version 4 with DW_CFA_set_loc and DW_CFA_MIPS_advance_loc8 cannot come from
   .cfi_* directives (set_loc's operand is an address): this one is written out. */
	.globl handmade
handmade:
	push %rbp
	mov %rsp, %rbp
	nop
	pop %rbp
	ret
handmade_end:

	.section .debug_frame, "", @progbits
frames:
cie:
	.long cie_end - cie_id
cie_id:
	.long 0xffffffff
	.byte 4                         /* version */
	.asciz ""                       /* augmentation */
	.byte 8, 0                      /* address size, segment selector size */
	.uleb128 1                      /* code alignment */
	.sleb128 -8                     /* data alignment */
	.uleb128 16                     /* return address column */
	.byte 0x0c, 7, 8                /* DW_CFA_def_cfa rsp+8 */
	.byte 0x90, 1                   /* DW_CFA_offset ra, -8 */
	.balign 8, 0
cie_end:
	.long fde_end - fde_cie
fde_cie:
	.long cie - frames
	.quad handmade
	.quad handmade_end - handmade
	.byte 0x41                      /* DW_CFA_advance_loc 1 */
	.byte 0x0e, 16                  /* DW_CFA_def_cfa_offset 16 */
	.byte 0x2f, 6, 2                /* DW_CFA_GNU_negative_offset_extended rbp, -(2 * -8) */
	.byte 0x01                      /* DW_CFA_set_loc */
	.quad handmade + 4
	.byte 0x0d, 6                   /* DW_CFA_def_cfa_register rbp */
	.byte 0x1d                      /* DW_CFA_MIPS_advance_loc8 */
	.quad 2
	.byte 0x0c, 7, 8                /* DW_CFA_def_cfa rsp+8 */
	.balign 8, 0
fde_end:
