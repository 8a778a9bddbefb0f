/* aarch64 boot: an arm64 Linux "Image" (the 64-byte header loaders look for: QEMU's -kernel, Xen's domain
 * builder), entered at EL1 (or EL2, which we leave) with the MMU off and x0 = the device tree's address. The
 * image is position-independent (linked at 0): it runs wherever it was put, once its R_AARCH64_RELATIVE
 * relocations are applied. Steps: leave EL2; build the identity map (boot.S: the first GiB as device memory
 * in 2 MiB blocks, the next three as write-back RAM in 1 GiB blocks) and turn the MMU and caches on; relocate;
 * clear the bss; then arm_main(dtb) on the boot stack, with the vectors and the FP unit (the workload) enabled. */

#define MAIR_VALUE 0x0004ff00 /* attr0 Device-nGnRnE, attr1 Normal write-back RW-allocate, attr2 Device-nGnRE */
/* T0SZ 32 (a 4 GiB space from level 1), walks write-back inner shareable, 4 KiB granule, no TTBR1 walks,
 * 32-bit physical addresses */
#define TCR_VALUE 0x803520
#define BLOCK_NORMAL 0x705                /* AF, inner shareable, attr1, block */
#define BLOCK_DEVICE_LO 0x409             /* AF, attr2, block */
#define BLOCK_DEVICE_HI (3 << 21)         /* PXN, UXN (bits 53, 54 of the descriptor: 21, 22 of its upper word) */
#define R_AARCH64_RELATIVE 1027

    .section .head, "ax"
    .global _head
_head:
    b primary_entry
    .long 0
    .quad 0                     /* text_offset: at a 2 MiB boundary (QEMU adds 2 MiB for its own boot code) */
    .quad _image_size           /* the image with its bss: loaders keep the DTB beyond it */
    .quad 0xa                   /* little-endian, 4 KiB pages, anywhere in RAM */
    .quad 0, 0, 0
    .ascii "ARM\x64"
    .long 0

    .text
primary_entry:
    mov x19, x0                 /* the device tree */
    msr daifset, #0xf
    mrs x1, CurrentEL
    lsr x1, x1, #2
    cmp x1, #2
    b.ne at_el1
    /* EL2 (QEMU with virtualization=on, a bare-metal boot): hand EL1 the counter, timer and GIC, then drop */
    mov x1, #(1 << 31)          /* HCR_EL2.RW: EL1 runs AArch64; no stage 2, nothing trapped */
    msr hcr_el2, x1
    mrs x1, cnthctl_el2
    orr x1, x1, #3              /* EL1PCTEN, EL1PCEN */
    msr cnthctl_el2, x1
    msr cntvoff_el2, xzr
    mov x1, #0x33ff             /* CPTR_EL2: RES1 bits, FP not trapped */
    msr cptr_el2, x1
    mrs x1, id_aa64pfr0_el1
    ubfx x1, x1, #24, #4        /* GIC system registers implemented? */
    cbz x1, 1f
    mrs x1, S3_4_C12_C9_5       /* ICC_SRE_EL2: SRE, and EL1 may use the system registers */
    orr x1, x1, #0x1
    orr x1, x1, #0x8
    msr S3_4_C12_C9_5, x1
    isb
1:  movz x1, #0x0800
    movk x1, #0x30d0, lsl #16   /* SCTLR_EL1's reset value: MMU and caches off */
    msr sctlr_el1, x1
    mov x1, #0x3c5              /* EL1h, DAIF masked */
    msr spsr_el2, x1
    adr x1, at_el1
    msr elr_el2, x1
    eret

at_el1:
    /* the page tables, written with the MMU off: no stale cache line may shadow them before or after */
    adrp x0, pgtables_start
    add x0, x0, :lo12:pgtables_start
    adrp x1, pgtables_end
    add x1, x1, :lo12:pgtables_end
    bl invalidate_range
    mov x2, x0
2:  stp xzr, xzr, [x2], #16
    cmp x2, x1
    b.lo 2b
    adrp x3, l1_table
    add x3, x3, :lo12:l1_table
    adrp x4, l2_device_gib
    add x4, x4, :lo12:l2_device_gib
    orr x5, x4, #3              /* L1[0]: the first GiB's table */
    str x5, [x3]
    mov x6, #1                  /* L1[1..3]: RAM, 1 GiB blocks */
3:  lsl x5, x6, #30
    mov x7, #BLOCK_NORMAL
    orr x5, x5, x7
    str x5, [x3, x6, lsl #3]
    add x6, x6, #1
    cmp x6, #4
    b.lo 3b
    mov x6, #0                  /* L2 of the first GiB: 512 device blocks of 2 MiB */
    mov x7, #BLOCK_DEVICE_LO
    mov x8, #BLOCK_DEVICE_HI
    lsl x8, x8, #32
    orr x7, x7, x8
4:  lsl x5, x6, #21
    orr x5, x5, x7
    str x5, [x4, x6, lsl #3]
    add x6, x6, #1
    cmp x6, #512
    b.lo 4b
    dsb sy
    bl invalidate_range

    movz x1, #(MAIR_VALUE & 0xffff)
    movk x1, #(MAIR_VALUE >> 16), lsl #16
    msr mair_el1, x1
    movz x1, #(TCR_VALUE & 0xffff)
    movk x1, #(TCR_VALUE >> 16), lsl #16
    msr tcr_el1, x1
    msr ttbr0_el1, x3
    isb
    tlbi vmalle1
    dsb nsh
    isb
    mrs x1, sctlr_el1
    orr x1, x1, #(1 << 0)       /* M: the MMU */
    orr x1, x1, #(1 << 2)       /* C: data caches */
    orr x1, x1, #(1 << 12)      /* I: instruction caches */
    bic x1, x1, #(1 << 1)       /* A: no alignment faults */
    bic x1, x1, #(1 << 19)      /* WXN */
    msr sctlr_el1, x1
    isb
    ic iallu
    dsb nsh
    isb

    /* relocate: each R_AARCH64_RELATIVE slot gets the load address plus its addend */
    adr x20, _head
    adrp x1, __rela_start
    add x1, x1, :lo12:__rela_start
    adrp x2, __rela_end
    add x2, x2, :lo12:__rela_end
5:  cmp x1, x2
    b.hs 6f
    ldp x3, x4, [x1], #16       /* r_offset, r_info */
    ldr x5, [x1], #8            /* r_addend */
    cmp w4, #R_AARCH64_RELATIVE
    b.ne 5b
    add x5, x5, x20
    str x5, [x20, x3]
    b 5b
6:  adrp x1, __bss_start
    add x1, x1, :lo12:__bss_start
    adrp x2, __bss_clear_end
    add x2, x2, :lo12:__bss_clear_end
7:  cmp x1, x2
    b.hs 8f
    str xzr, [x1], #8
    b 7b
8:  adrp x1, boot_stack_top
    add x1, x1, :lo12:boot_stack_top
    mov sp, x1
    adrp x1, vectors
    add x1, x1, :lo12:vectors
    msr vbar_el1, x1
    mov x1, #(3 << 20)          /* CPACR_EL1.FPEN: FP/SIMD at EL1 (only the workload uses it) */
    msr cpacr_el1, x1
    isb
    mov x0, x19
    bl arm_main
9:  wfi
    b 9b

/* dc ivac over [x0, x1): drop any cached copy (the data there was written, or will be, with the MMU off) */
invalidate_range:
    mov x2, x0
1:  dc ivac, x2
    add x2, x2, #64
    cmp x2, x1
    b.lo 1b
    dsb sy
    ret

    .section .pgtables, "aw", %nobits
    .balign 4096
    .global pgtables_start, l2_device_gib
pgtables_start:
l1_table:
    .skip 4096
l2_device_gib:
    .skip 4096
pgtables_end:

    .bss
    .balign 16
boot_stack:
    .skip 16384
    .global boot_stack_top
boot_stack_top:
