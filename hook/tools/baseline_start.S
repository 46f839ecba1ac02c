/* The probe's entry point (x86_64), in place of glibc's Scrt1.o: the one in a current glibc
 * calls __libc_start_main@GLIBC_2.34, and the probe runs in images back to glibc 2.17
 * (src/baseline.h). This is Scrt1.o's job, calling the GLIBC_2.2.5 version every glibc has:
 * init and fini are NULL, so glibc >= 2.34 runs the probe's constructors itself and older ones
 * run none (the probe has none). */
	.text
	.globl	_start
	.type	_start, @function
_start:
	xorl	%ebp, %ebp                      /* outermost frame */
	movq	%rdx, %r9                       /* rtld_fini, from the dynamic loader */
	popq	%rsi                            /* argc */
	movq	%rsp, %rdx                      /* argv */
	andq	$-16, %rsp
	pushq	%rax                            /* keep the stack 16-byte aligned */
	pushq	%rsp                            /* stack_end */
	xorl	%r8d, %r8d                      /* fini */
	xorl	%ecx, %ecx                      /* init */
	movq	main@GOTPCREL(%rip), %rdi
	call	*__libc_start_main@GOTPCREL(%rip)
	hlt                                     /* __libc_start_main does not return */
	.size	_start, . - _start
	.symver	__libc_start_main, __libc_start_main@GLIBC_2.2.5
	.section .note.GNU-stack, "", @progbits
