/* qmpprof example guest: COM1 serial console (polled) and a tiny printf. */
#include "kernel.h"

#define COM1 0x3f8

void serial_init(void)
{
    outb(COM1 + 1, 0x00);   /* no UART interrupts */
    outb(COM1 + 3, 0x80);   /* DLAB on */
    outb(COM1 + 0, 0x01);   /* divisor 1 -> 115200 baud */
    outb(COM1 + 1, 0x00);
    outb(COM1 + 3, 0x03);   /* 8N1, DLAB off */
    outb(COM1 + 2, 0xc7);   /* FIFO on, cleared, 14-byte threshold */
    outb(COM1 + 4, 0x03);   /* DTR | RTS */
}

void serial_putc(char c)
{
    while (!(inb(COM1 + 5) & 0x20))
        ;
    outb(COM1, (uint8_t)c);
}

void serial_puts(const char *s)
{
    while (*s)
        serial_putc(*s++);
}

static void put_uint(uint64_t v, unsigned base, int width, char pad)
{
    char buf[32];
    int n = 0;
    do {
        unsigned d = (unsigned)(v % base);
        buf[n++] = (char)(d < 10 ? '0' + d : 'a' + d - 10);
        v /= base;
    } while (v);
    while (n < width && n < (int)sizeof(buf))
        buf[n++] = pad;
    while (n)
        serial_putc(buf[--n]);
}

/* Supports %s %c %d %u %x %p %% with optional zero pad / width and l/ll.
 * l and ll mean a 64-bit argument, on i386 too (uint64_t / int64_t). */
void kprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    for (; *fmt; fmt++) {
        if (*fmt != '%') {
            serial_putc(*fmt);
            continue;
        }
        fmt++;
        char pad = ' ';
        int width = 0, lng = 0;
        if (*fmt == '0') {
            pad = '0';
            fmt++;
        }
        while (*fmt >= '0' && *fmt <= '9')
            width = width * 10 + (*fmt++ - '0');
        while (*fmt == 'l') {
            lng = 1;
            fmt++;
        }
        switch (*fmt) {
        case 's': {
            const char *s = va_arg(ap, const char *);
            serial_puts(s ? s : "(null)");
            break;
        }
        case 'c':
            serial_putc((char)va_arg(ap, int));
            break;
        case 'd': {
            int64_t v = lng ? va_arg(ap, int64_t) : va_arg(ap, int);
            if (v < 0) {
                serial_putc('-');
                v = -v;
            }
            put_uint((uint64_t)v, 10, width, pad);
            break;
        }
        case 'u':
            put_uint(lng ? va_arg(ap, uint64_t) : va_arg(ap, unsigned), 10, width, pad);
            break;
        case 'x':
            put_uint(lng ? va_arg(ap, uint64_t) : va_arg(ap, unsigned), 16, width, pad);
            break;
        case 'p':
            serial_puts("0x");
            put_uint((uint64_t)(uintptr_t)va_arg(ap, void *), 16, 2 * (int)sizeof(void *), '0');
            break;
        case '%':
            serial_putc('%');
            break;
        default:
            serial_putc('%');
            if (*fmt)
                serial_putc(*fmt);
            else
                fmt--;
        }
    }
    va_end(ap);
}
