/* aarch64 exception vectors. The kernel runs at EL1 on SP_EL1 (each thread its own stack), so every exception
 * it takes is a "current EL with SPx" one: IRQs (the GIC: timer, SGIs, the power button) and synchronous ones
 * (svc #0, the tiny kernel's switch trap; anything else is a fault). Each entry first reads the virtual counter
 * into isr_entry_cycles (the "first instruction of the handler" of the timer probe: two register saves precede
 * it), saves the general registers, ELR and SPSR as a frame on the current stack, and calls
 * arm_exception(frame, kind), which returns the frame to resume: the same one, or another thread's (a
 * preemption). A thread's saved state is always such a frame. The kernel is built -mgeneral-regs-only
 * (workload.c and math.c aside, which only the workload thread runs): no FP state to save. */

#define FRAME 272 /* x0-x30, ELR, SPSR, rounded to 16 bytes */

    .text
.macro ENTRY kind
    .balign 0x80
    sub sp, sp, #FRAME
    stp x0, x1, [sp]
    mrs x0, cntvct_el0
    adrp x1, isr_entry_cycles
    str x0, [x1, :lo12:isr_entry_cycles]
    mov x1, #\kind
    b exception_common
.endm

    .balign 2048
    .global vectors
vectors:
    /* current EL, SP0 (never used) */
    ENTRY 4
    ENTRY 4
    ENTRY 4
    ENTRY 4
    /* current EL, SPx: what we take */
    ENTRY 0 /* synchronous */
    ENTRY 1 /* IRQ */
    ENTRY 2 /* FIQ */
    ENTRY 3 /* SError */
    /* lower EL, AArch64 and AArch32 (there is none) */
    ENTRY 5
    ENTRY 5
    ENTRY 5
    ENTRY 5
    ENTRY 5
    ENTRY 5
    ENTRY 5
    ENTRY 5

exception_common:
    stp x2, x3, [sp, #16]
    stp x4, x5, [sp, #32]
    stp x6, x7, [sp, #48]
    stp x8, x9, [sp, #64]
    stp x10, x11, [sp, #80]
    stp x12, x13, [sp, #96]
    stp x14, x15, [sp, #112]
    stp x16, x17, [sp, #128]
    stp x18, x19, [sp, #144]
    stp x20, x21, [sp, #160]
    stp x22, x23, [sp, #176]
    stp x24, x25, [sp, #192]
    stp x26, x27, [sp, #208]
    stp x28, x29, [sp, #224]
    str x30, [sp, #240]
    mrs x2, elr_el1
    mrs x3, spsr_el1
    stp x2, x3, [sp, #248]
    mov x0, sp
    bl arm_exception
    mov sp, x0
    ldp x2, x3, [sp, #248]
    msr elr_el1, x2
    msr spsr_el1, x3
    ldr x30, [sp, #240]
    ldp x28, x29, [sp, #224]
    ldp x26, x27, [sp, #208]
    ldp x24, x25, [sp, #192]
    ldp x22, x23, [sp, #176]
    ldp x20, x21, [sp, #160]
    ldp x18, x19, [sp, #144]
    ldp x16, x17, [sp, #128]
    ldp x14, x15, [sp, #112]
    ldp x12, x13, [sp, #96]
    ldp x10, x11, [sp, #80]
    ldp x8, x9, [sp, #64]
    ldp x6, x7, [sp, #48]
    ldp x4, x5, [sp, #32]
    ldp x2, x3, [sp, #16]
    ldp x0, x1, [sp]
    add sp, sp, #FRAME
    eret
