/*
 * lohan_steps.h: a training process's optimizer steps on its registered
 * model, in liblohan_client, with lohan_client.h's conventions (int status,
 * lohan_last_error, opaque handles with a destroy that accepts NULL, no
 * exceptions or aborts). What every plugin runs between its gradient hooks
 * and the daemon: the committed-step count, the learning rate, fp16 loss
 * scaling, and the step in progress with its gradient hand-overs.
 *
 * Per step:
 *   lohan_steps_scale_loss          (fp16) the factor for this step's loss
 *   lohan_steps_begin(lr)           when the first gradient is ready
 *   per layer, as backward completes it:
 *     lohan_steps_claim_grad_buffer   before writing the layer's buffer
 *     lohan_steps_grad_ready          (or _from_device), not waited for
 *   lohan_steps_end                 waits for them; global norm, clip, skip
 * or lohan_steps_discard to throw the step away (the daemon rolls back the
 * updates it ran). Not thread-safe: one thread at a time.
 */
#ifndef LOHAN_STEPS_H_
#define LOHAN_STEPS_H_

#include "lohan/lohan_client.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lohan_steps lohan_steps;

/* `options_json`: a TrainingStepsOptions (proto/training_steps.proto) in
   protobuf JSON: the first learning rate, the loss scaling, and the one a
   resumed checkpoint kept. The count starts at the model's committed
   iterations. LOHAN_INVALID_ARGUMENT naming the field for a value out of
   range. `model` must outlive the handle: destroy this first. */
LOHAN_CLIENT_API int lohan_steps_create(lohan_model* model,
                                        const char* options_json,
                                        lohan_steps** out);
LOHAN_CLIENT_API void lohan_steps_destroy(lohan_steps* steps);

/* Committed steps (skipped ones do not count). */
LOHAN_CLIENT_API uint64_t lohan_steps_committed(const lohan_steps* steps);
/* 1 while a step is in progress (begun, not ended or discarded). */
LOHAN_CLIENT_API int lohan_steps_active(const lohan_steps* steps);
/* The learning rate of the last step begun, or of the next if set since. */
LOHAN_CLIENT_API double lohan_steps_lr(const lohan_steps* steps);
/* The learning rate of the steps begun from now on (finite, >= 0). */
LOHAN_CLIENT_API int lohan_steps_set_lr(lohan_steps* steps, double lr);
/* The loss scaling now, a LossScaling in protobuf JSON with the proto's
   field names (lohan_string_free): what a checkpoint keeps. */
LOHAN_CLIENT_API int lohan_steps_loss_scaling_json(const lohan_steps* steps,
                                                   char** out);
/* Replaces the loss scaling state (a framework's saved scaler). */
LOHAN_CLIENT_API int lohan_steps_set_loss_scaling_json(lohan_steps* steps,
                                                       const char* json);
/* The factor to multiply this step's loss by; the step's gradients then
   carry it and the daemon divides it out. 1 without loss scaling. */
LOHAN_CLIENT_API int lohan_steps_scale_loss(lohan_steps* steps, double* scale);

/* Begins a step unless one is in progress: at `*lr` (NULL: the rate set
   last). On the daemon's refusal no step is in progress. */
LOHAN_CLIENT_API int lohan_steps_begin(lohan_steps* steps, const double* lr);
/* Waits until the layer's gradient buffer may be written: the daemon has
   taken the gradient handed over last through it (a buffer several layers
   share, in a streamed layout). */
LOHAN_CLIENT_API int lohan_steps_claim_grad_buffer(lohan_steps* steps,
                                                   uint32_t layer);
/* The layer's gradient is in its buffer: GRAD_READY, not waited for.
   LOHAN_FAILED_PRECONDITION outside a step. */
LOHAN_CLIENT_API int lohan_steps_grad_ready(lohan_steps* steps, uint32_t layer);
/* The layer's gradient at `device_source` (`bytes`, the layer's size) on
   CUDA device `device` (>= 0): copied into its buffer on `cuda_stream`
   (NULL: the default stream), then GRAD_READY; returns once enqueued
   (lohan_model_grad_ready_from_device_on_device's contract). */
LOHAN_CLIENT_API int lohan_steps_grad_ready_from_device(
    lohan_steps* steps, uint32_t layer, int device, const void* device_source,
    uint64_t bytes, void* cuda_stream);
/* Ends the step: waits for every hand-over, then ITER_END.
   `global_sum_squares` (NULL, or data-parallel ranks whose jobs hold
   shards): the sum over every rank of the squares of the gradients as
   handed over (still carrying the loss scale), the same on every rank.
   Outputs may be NULL. A failed hand-over throws the step away and is
   returned; no step is in progress after, either way. */
LOHAN_CLIENT_API int lohan_steps_end(lohan_steps* steps,
                                     const double* global_sum_squares,
                                     double* global_norm, int* clipped,
                                     int* skipped);
/* Throws the step in progress away (a no-op between steps): hand-overs
   waited for (failures ignored), then ITER_ABORT, whose refusal is
   returned with this side clean all the same. */
LOHAN_CLIENT_API int lohan_steps_discard(lohan_steps* steps);
/* Lets every hand-over in flight land or fail, up to `timeout_ms` each
   (< 0: no limit), failures ignored: before the arena goes. */
LOHAN_CLIENT_API void lohan_steps_settle(lohan_steps* steps,
                                         int64_t timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* LOHAN_STEPS_H_ */
