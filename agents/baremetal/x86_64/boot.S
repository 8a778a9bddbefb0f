/* Boot: a multiboot 1 header (QEMU -kernel, GRUB) and a PVH entry note (Xen, QEMU -kernel of an ELF
 * without multiboot), both landing in 32-bit protected mode without paging. The common path builds an
 * identity map of the first 4 GiB with 2 MiB pages, enters long mode and calls kmain(boot, info)
 * with boot = 1 (multiboot, info = multiboot information) or 2 (PVH, info = hvm_start_info). */

#define MB_MAGIC 0x1BADB002
#define MB_FLAGS 0x00010000 /* bit 16: the load addresses below are valid (the image is ELF64) */

    .section .multiboot, "a"
    .align 4
multiboot_header:
    .long MB_MAGIC
    .long MB_FLAGS
    .long -(MB_MAGIC + MB_FLAGS)
    .long multiboot_header /* header_addr */
    .long __image_start    /* load_addr */
    .long __load_end       /* load_end_addr: file bytes to load */
    .long __bss_end        /* bss_end_addr: zeroed up to here */
    .long multiboot_entry  /* entry_addr */

    /* XEN_ELFNOTE_PHYS32_ENTRY (18): the PVH entry point. */
    .section .note.Xen, "a"
    .align 4
    .long 4, 4, 18
    .asciz "Xen"
    .align 4
    .long pvh_entry

    .section .boot, "ax"
    .code32
    .global multiboot_entry
multiboot_entry:
    movl $1, %esi
    jmp common32
    .global pvh_entry
pvh_entry:
    movl $2, %esi
common32:
    cli
    cld
    movl %ebx, %edi
    movl $boot_stack_top, %esp

    /* PML4[0] -> PDPT; PDPT[0..3] -> four page directories of 512 x 2 MiB each. */
    movl $pdpt, %eax
    orl $3, %eax
    movl %eax, pml4
    movl $0, %ecx
1:  movl %ecx, %eax
    shll $12, %eax
    addl $page_dirs, %eax
    orl $3, %eax
    movl %eax, pdpt(, %ecx, 8)
    incl %ecx
    cmpl $4, %ecx
    jne 1b
    movl $0, %ecx
2:  movl %ecx, %eax
    shll $21, %eax
    orl $0x83, %eax /* present, writable, 2 MiB */
    movl %eax, page_dirs(, %ecx, 8)
    movl %ecx, %eax
    shrl $11, %eax  /* bits 32.. of the address: entries 2048.. do not exist here */
    movl %eax, page_dirs+4(, %ecx, 8)
    incl %ecx
    cmpl $2048, %ecx
    jne 2b

    movl $pml4, %eax
    movl %eax, %cr3
    movl %cr4, %eax
    orl $((1 << 5) | (1 << 9) | (1 << 10)), %eax /* PAE, OSFXSR, OSXMMEXCPT (SSE for the workload) */
    movl %eax, %cr4
    movl $0xC0000080, %ecx /* EFER.LME */
    rdmsr
    orl $(1 << 8), %eax
    wrmsr
    movl %cr0, %eax
    andl $~(1 << 2), %eax              /* no x87 emulation */
    orl $((1 << 31) | (1 << 1) | 1), %eax /* paging, MP, protected mode */
    movl %eax, %cr0
    lgdt gdt_pointer
    ljmp $0x08, $long_mode

    .code64
long_mode:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    xorw %ax, %ax
    movw %ax, %fs
    movw %ax, %gs
    movl $boot_stack_top, %esp
    movl %edi, %edi /* the upper halves are undefined after the mode switch */
    movl %esi, %esi
    xchgq %rdi, %rsi /* kmain(boot kind, info) */
    call kmain
3:  cli
    hlt
    jmp 3b

    .section .rodata
    .align 16
gdt:
    .quad 0
    .quad 0x00AF9A000000FFFF /* 0x08: 64-bit code */
    .quad 0x00CF92000000FFFF /* 0x10: data */
gdt_end:
    .align 4
gdt_pointer:
    .word gdt_end - gdt - 1
    .long gdt

    .section .bss
    .align 4096
pml4:
    .skip 4096
pdpt:
    .skip 4096
    .global page_dirs
page_dirs:
    .skip 4 * 4096
    .align 16
boot_stack:
    .skip 16384
    .global boot_stack_top
boot_stack_top:
