#ifndef LOHAN_DAEMON_OPTIM_OPTIM_C_API_H_
#define LOHAN_DAEMON_OPTIM_OPTIM_C_API_H_

/* A small C ABI over daemon/optim, built as liblohan_optim.so, for the
 * Python tests against torch and the benchmark driver (ctypes). Not the
 * client API: the daemon uses the C++ classes directly.
 *
 * Conventions: every function that can fail returns 0 on success or an
 * absl::StatusCode value (3 INVALID_ARGUMENT, 9 FAILED_PRECONDITION...);
 * lohan_optim_last_error() then gives the message of the calling thread's
 * last failure (valid until its next call). Buffers are borrowed, passed as
 * pointer + element count. Every create has a destroy. dtype codes:
 * 0 float32, 1 bfloat16, 2 float16. */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lohan_optim lohan_optim;

/* Message of this thread's last failure ("" if none). */
const char* lohan_optim_last_error(void);

/* 1 if this CPU can run the path "avx512" / "avx2" / "scalar", 0 if not,
 * -1 for an unknown name. */
int lohan_optim_cpu_supports(const char* isa);

/* Creates an optimizer handle. isa: NULL or "" for $LOHAN_OPTIM_ISA or the
 * best path, else "avx512" / "avx2" / "scalar" (error if the CPU lacks it).
 * num_threads: 0 runs on the calling thread, else a pool of that many
 * worker threads (pinned if pin != 0). *out receives the handle. */
int lohan_optim_create(const char* isa, int num_threads, int pin,
                       lohan_optim** out);
void lohan_optim_destroy(lohan_optim* handle);

/* The path in use ("avx512"...), and the kernel variant ("avx512+bf16"). */
const char* lohan_optim_isa(const lohan_optim* handle);
const char* lohan_optim_kernel_name(const lohan_optim* handle);

/* How the kernels move memory, as "prefetch=1024,stream=on,chunks=1" (see
 * tuning.h); valid until the handle's next tuning change. */
const char* lohan_optim_tuning(const lohan_optim* handle);

/* Sets the tuning from that form (fields missing keep their defaults). */
int lohan_optim_set_tuning(lohan_optim* handle, const char* tuning);

/* Times the candidate paths (the ISA given at create, else every vector
 * path) and tunings on this handle's pool (calibration.h) and keeps the
 * fastest, as lohand does at its first start.
 * working_set_bytes 0: twice the last-level cache; rounds 0: the default. Runs
 * for a second or a few. */
int lohan_optim_calibrate(lohan_optim* handle, size_t working_set_bytes,
                          int rounds);

/* One Adam/AdamW step of one tensor of n elements (see adam.h). *step is the
 * tensor's step counter, incremented on success. max_exp_avg_sq may be NULL
 * unless amsgrad. out may be NULL (no 16-bit copy). grad_sum_squares and
 * grad_nonfinite may be NULL. */
int lohan_optim_adam_step(lohan_optim* handle, size_t n, float* weight,
                          void* exp_avg, void* exp_avg_sq, void* max_exp_avg_sq,
                          int moment_dtype, int64_t* step, const void* grad,
                          int grad_dtype, float inv_scale, void* out,
                          int out_dtype, double lr, double beta1, double beta2,
                          double eps, double weight_decay, int decoupled,
                          int amsgrad, double* grad_sum_squares,
                          int* grad_nonfinite);

/* One SGD step (see sgd.h). momentum_buffer may be NULL if momentum == 0. */
int lohan_optim_sgd_step(lohan_optim* handle, size_t n, float* weight,
                         float* momentum_buffer, int64_t* step,
                         const void* grad, int grad_dtype, float inv_scale,
                         void* out, int out_dtype, double lr, double momentum,
                         double dampening, double weight_decay, int nesterov,
                         double* grad_sum_squares, int* grad_nonfinite);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // LOHAN_DAEMON_OPTIM_OPTIM_C_API_H_
