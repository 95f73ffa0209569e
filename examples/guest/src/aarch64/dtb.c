/* qmpprof example guest, AArch64 build: the flattened device tree.
 *
 * For an ELF kernel that is not a Linux image QEMU does not pass the DTB
 * address in x0; the virt board writes the DTB at the start of RAM
 * (0x40000000) when the kernel is loaded above it, as this one is. Only two
 * things are read from it: /chosen/bootargs (QEMU -append, e.g.
 * "workload=user") and the first /memory node's reg. */
#include "kernel.h"

#define FDT_MAGIC       0xd00dfeed
#define FDT_BEGIN_NODE  1
#define FDT_END_NODE    2
#define FDT_PROP        3
#define FDT_NOP         4
#define FDT_END         9

char boot_cmdline[256];
uint64_t boot_mem_start = RAM_PHYS, boot_mem_size = 128ULL << 20;

static uint32_t be32(const void *p)
{
    const uint8_t *b = p;
    return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
}

static uint64_t be64(const void *p)
{
    return ((uint64_t)be32(p) << 32) | be32((const uint8_t *)p + 4);
}

static int str_eq(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

static int str_prefix(const char *s, const char *prefix)
{
    while (*prefix)
        if (*s++ != *prefix++)
            return 0;
    return 1;
}

void dtb_scan(void)
{
    const uint8_t *fdt = (const uint8_t *)PHYS_TO_KVA(RAM_PHYS);
    if (be32(fdt) != FDT_MAGIC) {
        kprintf("qmpprof-guest: no device tree at 0x%lx\n", (uint64_t)RAM_PHYS);
        return;
    }
    const uint8_t *p = fdt + be32(fdt + 8);             /* off_dt_struct */
    const char *strings = (const char *)fdt + be32(fdt + 12);
    int depth = 0, in_chosen = 0, in_memory = 0, got_memory = 0;
    for (;;) {
        uint32_t tok = be32(p);
        p += 4;
        if (tok == FDT_BEGIN_NODE) {
            const char *name = (const char *)p;
            int len = 0;
            while (name[len])
                len++;
            p += (len + 4) & ~3;                        /* name, NUL, padding */
            depth++;
            in_chosen = depth == 2 && str_eq(name, "chosen");
            in_memory = depth == 2 && str_prefix(name, "memory");
        } else if (tok == FDT_END_NODE) {
            depth--;
            in_chosen = in_memory = 0;
        } else if (tok == FDT_PROP) {
            uint32_t len = be32(p), nameoff = be32(p + 4);
            const uint8_t *val = p + 8;
            const char *pname = strings + nameoff;
            if (in_chosen && str_eq(pname, "bootargs")) {
                uint32_t n = 0;
                while (n < len && n < sizeof(boot_cmdline) - 1 && val[n]) {
                    boot_cmdline[n] = (char)val[n];
                    n++;
                }
                boot_cmdline[n] = 0;
            } else if (in_memory && !got_memory && str_eq(pname, "reg") && len >= 16) {
                boot_mem_start = be64(val);             /* #address-cells = #size-cells = 2 */
                boot_mem_size = be64(val + 8);
                got_memory = 1;
            }
            p += 8 + ((len + 3) & ~3);
        } else if (tok == FDT_NOP) {
            continue;
        } else {
            break;                                      /* FDT_END or garbage */
        }
    }
}
