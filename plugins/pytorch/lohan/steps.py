"""A training process's optimizer steps over liblohan_client's
lohan_steps.h: the committed-step count, the learning rate, fp16 loss
scaling, and the step in progress with its gradient hand-overs (the
tickets, the shared buffers' turns). One implementation for both plugins."""

from __future__ import annotations

import ctypes
import json
from typing import Any, Dict, Mapping, Optional, Tuple

from lohan.client import Model, _check, proto_json, take_text

# What the daemon decided at the end of a step: the global norm (before
# clipping), whether it clipped, whether it skipped the update.
Outcome = Tuple[float, bool, bool]


class TrainingSteps:
    """lohan_steps over `model` (closed with it; the count and the loss
    scaling stay readable after). `loss_scaling` and `resumed`:
    LossScaling objects (proto/training_steps.proto)."""

    def __init__(self, model: Model, lr: float,
                 loss_scaling: Mapping[str, Any],
                 resumed: Optional[Mapping[str, Any]] = None) -> None:
        self._lib = model._lib
        options: Dict[str, Any] = {"lr": lr, "loss_scaling": loss_scaling}
        if resumed:
            options["resumed"] = {key: resumed[key] for key in
                                  ("scale", "good_steps") if key in resumed}
        handle = ctypes.c_void_p()
        _check(self._lib.lohan_steps_create(
            model._handle, proto_json(options), ctypes.byref(handle)))
        self._handle = handle
        self._closed_state: Optional[Tuple[int, Dict[str, Any]]] = None
        model.on_close(self.close)

    @property
    def committed(self) -> int:
        if self._closed_state is not None:
            return self._closed_state[0]
        return int(self._lib.lohan_steps_committed(self._handle))

    @property
    def active(self) -> bool:
        return bool(self._lib.lohan_steps_active(self._handle))

    @property
    def loss_scaling(self) -> Dict[str, Any]:
        if self._closed_state is not None:
            return dict(self._closed_state[1])
        text = ctypes.c_void_p()
        _check(self._lib.lohan_steps_loss_scaling_json(self._handle,
                                                       ctypes.byref(text)))
        return json.loads(take_text(text))

    def set_loss_scaling(self, **fields: Any) -> None:
        """Replaces the fields given (scale, good_steps, ...)."""
        scaling = {**self.loss_scaling, **fields}
        _check(self._lib.lohan_steps_set_loss_scaling_json(
            self._handle, proto_json(scaling)))

    def scale_loss(self) -> float:
        """The factor for this step's loss (its gradients carry it)."""
        scale = ctypes.c_double()
        _check(self._lib.lohan_steps_scale_loss(self._handle,
                                                ctypes.byref(scale)))
        return scale.value

    def begin(self, lr: float) -> None:
        _check(self._lib.lohan_steps_begin(
            self._handle, ctypes.byref(ctypes.c_double(lr))))

    def claim_grad_buffer(self, layer: int) -> None:
        _check(self._lib.lohan_steps_claim_grad_buffer(self._handle, layer))

    def grad_ready(self, layer: int) -> None:
        _check(self._lib.lohan_steps_grad_ready(self._handle, layer))

    def grad_ready_from_device(self, layer: int, address: int, nbytes: int,
                               stream: int, device: int) -> None:
        _check(self._lib.lohan_steps_grad_ready_from_device(
            self._handle, layer, device, address, nbytes, stream or None))

    def end(self, global_sum_squares: Optional[float] = None) -> Outcome:
        norm = ctypes.c_double()
        clipped, skipped = ctypes.c_int(), ctypes.c_int()
        given = (None if global_sum_squares is None else
                 ctypes.byref(ctypes.c_double(global_sum_squares)))
        _check(self._lib.lohan_steps_end(
            self._handle, given, ctypes.byref(norm), ctypes.byref(clipped),
            ctypes.byref(skipped)))
        return norm.value, bool(clipped.value), bool(skipped.value)

    def discard(self) -> None:
        _check(self._lib.lohan_steps_discard(self._handle))

    def settle(self, timeout: float) -> None:
        self._lib.lohan_steps_settle(self._handle, int(timeout * 1000))

    def close(self) -> None:
        if self._handle:
            self._closed_state = (self.committed, self.loss_scaling)
            self._lib.lohan_steps_destroy(self._handle)
            self._handle = ctypes.c_void_p()
