// The program whose QEMU register dump is ../regs_aarch64_el0_sve_smp2.txt: at EL1 it
// enables FP and SVE, sets x29, x30 and SP_EL0 to known values and drops to EL0, where it
// loops. Built with `aarch64-linux-gnu-gcc -nostdlib -static -Wl,-Ttext=0x40080000`, booted
// with `qemu-system-aarch64 -M virt -cpu max -smp 2 -kernel`; the dump was taken after a
// QMP stop (vCPU 1 stays powered off at its reset state, EL1).
    .global _start
_start:
    mov x0, #(3 << 20)
    orr x0, x0, #(3 << 16)
    msr cpacr_el1, x0
    isb
    ldr x1, =0x40100000
    mov sp, x1
    mov x29, #0x1234
    mov x30, #0x5678
    msr sp_el0, x1
    adr x2, user
    msr elr_el1, x2
    msr spsr_el1, xzr
    eret
user:
    mov x3, #7
1:  add x3, x3, #1
    b 1b
