/* Interrupt stubs. Every stub first reads the TSC into isr_entry_cycles (the "first instruction of the
 * handler" of the timer probe: two pushes precede it), then saves the general registers and calls
 * isr_dispatch(frame), which returns the frame to resume: the same one, or another thread's (a
 * preemption). Threads of the tiny kernel are switched only here, so a thread's saved state is
 * always such a frame. The kernel is built with -mgeneral-regs-only: no SSE state to save. */

    .text
    .code64

.macro STUB vector, has_error
    .global isr_stub_\vector
isr_stub_\vector:
    pushq %rax
    pushq %rdx
    rdtsc
    shlq $32, %rdx
    orq %rdx, %rax
    movq %rax, isr_entry_cycles(%rip)
    popq %rdx
    popq %rax
.if \has_error == 0
    pushq $0
.endif
    pushq $\vector
    jmp isr_common
.endm

/* exceptions 0..31 (8, 10-14, 17, 21, 29, 30 push an error code) */
STUB 0, 0
STUB 1, 0
STUB 2, 0
STUB 3, 0
STUB 4, 0
STUB 5, 0
STUB 6, 0
STUB 7, 0
STUB 8, 1
STUB 9, 0
STUB 10, 1
STUB 11, 1
STUB 12, 1
STUB 13, 1
STUB 14, 1
STUB 15, 0
STUB 16, 0
STUB 17, 1
STUB 18, 0
STUB 19, 0
STUB 20, 0
STUB 21, 1
STUB 22, 0
STUB 23, 0
STUB 24, 0
STUB 25, 0
STUB 26, 0
STUB 27, 0
STUB 28, 0
STUB 29, 1
STUB 30, 1
STUB 31, 0
STUB 32, 0
STUB 33, 0
STUB 34, 0
STUB 35, 0
STUB 255, 0

/* switch_trap(): the frame `int $34` would push (ss, rsp, rflags, cs, rip), interrupts off, then its stub; the
 * stub's iretq returns here as `ret` would. rax and rdx are the caller's to lose (a call clobbers them). */
    .global switch_trap
switch_trap:
    popq %rax          /* the return address: rsp is the caller's again */
    movq %rsp, %rdx
    pushq $0x10
    pushq %rdx
    pushfq
    cli
    pushq $0x08
    pushq %rax
    jmp isr_stub_34

isr_common:
    pushq %rax
    pushq %rbx
    pushq %rcx
    pushq %rdx
    pushq %rsi
    pushq %rdi
    pushq %rbp
    pushq %r8
    pushq %r9
    pushq %r10
    pushq %r11
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, %rdi
    andq $-16, %rsp /* the ABI's alignment for the C handler */
    call isr_dispatch
    movq %rax, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %r11
    popq %r10
    popq %r9
    popq %r8
    popq %rbp
    popq %rdi
    popq %rsi
    popq %rdx
    popq %rcx
    popq %rbx
    popq %rax
    addq $16, %rsp /* vector and error code */
    iretq

    .section .rodata
    .align 8
    .global isr_stubs
isr_stubs: /* vectors 0..35, then 255 */
    .irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,255
    .quad isr_stub_\v
    .endr
