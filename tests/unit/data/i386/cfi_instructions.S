/* Every DW_CFA_* instruction in hand-written i386 CFI, for test_cfi_i386.py: the
   32-bit twin of ../cfi_instructions.S, with i386 register numbers (0 eax, 1 ecx,
   2 edx, 3 ebx, 4 esp, 5 ebp, 6 esi, 7 edi, 8 eip, 9 eflags) where x86-64's differ,
   so that every instruction's register operand is renumbered by qmpprof.
   gas has directives for some; the others are spelled out with .cfi_escape.
   Operands are single-byte LEB128 numbers; data alignment is -4, code alignment 1.
   Built with -DBOTH_SECTIONS, gas also writes the same CFI to .debug_frame. */
#ifdef BOTH_SECTIONS
	.cfi_sections .eh_frame, .debug_frame
#endif
	.text
	.globl _start
_start:
	.cfi_startproc
	push %ebp
	.cfi_def_cfa_offset 8
	.cfi_offset %ebp, -8
	nop
	.cfi_escape 0x05, 3, 3          /* DW_CFA_offset_extended ebx, 3 * -4 */
	nop
	.cfi_escape 0x11, 6, 0x7c       /* DW_CFA_offset_extended_sf esi, -4 * -4 */
	nop
	.cfi_escape 0x14, 7, 2          /* DW_CFA_val_offset edi, 2 * -4 */
	nop
	.cfi_escape 0x15, 2, 0x7f       /* DW_CFA_val_offset_sf edx, -1 * -4 */
	nop
	.cfi_escape 0x06, 3             /* DW_CFA_restore_extended ebx */
	.cfi_restore %ebp               /* DW_CFA_restore */
	nop
	.cfi_undefined %ecx             /* DW_CFA_undefined */
	.cfi_same_value %esi            /* DW_CFA_same_value */
	.cfi_register %ebx, %edx        /* DW_CFA_register */
	.cfi_offset 9, -12              /* DW_CFA_offset eflags: no x86-64 twin */
	nop
	.cfi_escape 0x12, 5, 0x7e       /* DW_CFA_def_cfa_sf ebp, -2 * -4 */
	nop
	.cfi_escape 0x13, 0x7d          /* DW_CFA_def_cfa_offset_sf -3 * -4 */
	nop
	.cfi_escape 0x2e, 0x10          /* DW_CFA_GNU_args_size 16 */
	nop
	.cfi_remember_state             /* DW_CFA_remember_state */
	.cfi_def_cfa %esp, 4            /* DW_CFA_def_cfa */
	.cfi_offset %ebx, -24
	nop
	.cfi_restore_state              /* DW_CFA_restore_state */
	nop
	.cfi_escape 0x0f, 2, 0x74, 4    /* DW_CFA_def_cfa_expression: DW_OP_breg4 (esp) 4 */
	nop
	.cfi_escape 0x10, 5, 2, 0x75, 0 /* DW_CFA_expression ebp: DW_OP_breg5 (ebp) 0 */
	.cfi_escape 0x16, 3, 2, 0x75, 4 /* DW_CFA_val_expression ebx: DW_OP_breg5 (ebp) 4 */
	nop
	.cfi_def_cfa_register %ebp      /* DW_CFA_def_cfa_register, after an expression */
	nop
	.cfi_escape 0x00                /* DW_CFA_nop */
	.cfi_escape 0x2f, 7, 2          /* DW_CFA_GNU_negative_offset_extended edi, -(2 * -4) */
	.cfi_escape 0x2d                /* DW_CFA_GNU_window_save: no x86 state */
	nop
	.fill 100, 1, 0x90              /* DW_CFA_advance_loc1 */
	.cfi_adjust_cfa_offset 4
	.fill 300, 1, 0x90              /* DW_CFA_advance_loc2 */
	.cfi_adjust_cfa_offset 4
	.fill 70000, 1, 0x90            /* DW_CFA_advance_loc4 */
	.cfi_adjust_cfa_offset 4
	ret
	.cfi_endproc

/* A CIE of version 4 with DW_CFA_set_loc and DW_CFA_MIPS_advance_loc8 cannot come from
   .cfi_* directives (set_loc's operand is an address): this one is written out, with
   4-byte addresses. */
	.globl handmade
handmade:
	push %ebp
	mov %esp, %ebp
	nop
	pop %ebp
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
	.byte 4, 0                      /* address size, segment selector size */
	.uleb128 1                      /* code alignment */
	.sleb128 -4                     /* data alignment */
	.uleb128 8                      /* return address column: eip */
	.byte 0x0c, 4, 4                /* DW_CFA_def_cfa esp+4 */
	.byte 0x88, 1                   /* DW_CFA_offset eip, -4 */
	.balign 4, 0
cie_end:
	.long fde_end - fde_cie
fde_cie:
	.long cie - frames
	.long handmade
	.long handmade_end - handmade
	.byte 0x41                      /* DW_CFA_advance_loc 1 */
	.byte 0x0e, 8                   /* DW_CFA_def_cfa_offset 8 */
	.byte 0x2f, 5, 2                /* DW_CFA_GNU_negative_offset_extended ebp, -(2 * -4) */
	.byte 0x01                      /* DW_CFA_set_loc */
	.long handmade + 3
	.byte 0x0d, 5                   /* DW_CFA_def_cfa_register ebp */
	.byte 0x1d                      /* DW_CFA_MIPS_advance_loc8 */
	.quad 1
	.byte 0x0c, 4, 4                /* DW_CFA_def_cfa esp+4 */
	.balign 4, 0
fde_end:
