/* Which OpenBLAS kernel dapod's processes run, chosen by measuring on the machine that runs them
 * (docs/ENGINE.md "The OpenBLAS kernel").
 *
 * A DYNAMIC_ARCH OpenBLAS picks its kernel from the processor's id when the library loads, and
 * an OpenBLAS older than the processor falls back to a slow generic kernel (Debian 12's 0.3.21
 * on a Sapphire Rapids Xeon runs its SSE3 "Prescott" SGEMM at a tenth of what its AVX-512
 * kernel does). The kernel can only be named before the library loads, through the environment
 * variable OPENBLAS_CORETYPE, so the choice is made first thing in main: each candidate kernel
 * is measured in a child process of its own (one that dies on an instruction the processor
 * lacks, or computes wrong products, is out), and the process re-executes itself with the
 * winner named. The choice is kept per machine (processor, OpenBLAS build, thread count) in a
 * cache file under a lock, so every process of the machine, the ranks of one data-parallel job
 * and a job and its resume included, runs the same kernel and rounds the same way.
 *
 * Never overrides an OPENBLAS_CORETYPE the environment already sets. DAPOD_BLAS_KERNEL selects
 * the policy: "auto" (the default: measure once, then the cache), "library" (OpenBLAS's own
 * pick, nothing measured), or a kernel name to use as is. */
#ifndef DAPOD_BLAS_CHOICE_H
#define DAPOD_BLAS_CHOICE_H

/* Called first in main with main's arguments. May re-execute the process (execv of
 * /proc/self/exe with the same argv and OPENBLAS_CORETYPE set); returns when the process runs
 * the chosen kernel, or when it cannot (then it runs OpenBLAS's own pick, said on stderr). A
 * hidden subcommand, argv[1] == "__blas-probe", is the child that measures one kernel: it never
 * returns. */
void blas_choice_apply(int argc, char **argv);

/* One line for the logs: the kernel running and why ("SkylakeX, measured 2.4x OpenBLAS's own
 * pick Prescott", "Haswell, set by OPENBLAS_CORETYPE", ...). Static storage. */
const char *blas_choice_describe(void);

/* `dapod kernels [--json]`: measures every candidate now, prints the table and the choice, and
 * refreshes the cache. Returns the exit status. */
int blas_choice_cmd(int argc, char **argv);

#endif
