/* A sized function with a global label inside it, as the kernel's entry code has
   (SYM_CODE_START(entry_SYSCALL_64) ... SYM_INNER_LABEL(entry_SYSCALL_64_after_hwframe)),
   and a label of its own after it, inside no function. */
        .text
        .globl _start
        .type _start, @function
_start:
        nop
        nop
        .globl inner_label
inner_label:
        nop
        nop
        ret
        .size _start, . - _start
        .globl lone_label
lone_label:
        nop
        ret
