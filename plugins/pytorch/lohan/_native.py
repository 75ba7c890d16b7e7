"""Finds and loads liblohan_client.so and declares its C ABI for ctypes."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path
from typing import List, Optional

_LIBRARY_NAME = "liblohan_client.so"


def _candidates() -> List[str]:
    found: List[str] = []
    explicit = os.environ.get("LOHAN_CLIENT_LIB")
    if explicit:
        return [explicit]
    bazel_bin = os.environ.get("LOHAN_BAZEL_BIN")
    if bazel_bin:
        found.append(str(Path(bazel_bin) / "client" / _LIBRARY_NAME))
    # An installed wheel (scripts/wheel) carries its own.
    bundled = Path(__file__).resolve().parent / "_lib" / _LIBRARY_NAME
    if bundled.exists():
        found.append(str(bundled))
    # A checkout: plugins/pytorch/lohan/_native.py -> repo root.
    repo = Path(__file__).resolve().parents[3]
    found.append(str(repo / "bazel-bin" / "client" / _LIBRARY_NAME))
    system = ctypes.util.find_library("lohan_client")
    found.append(system or _LIBRARY_NAME)
    return found


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    c_int, c_char_p, c_void_p = ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p
    u32, u64, i32, size_t = (ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32,
                             ctypes.c_size_t)
    pp = ctypes.POINTER(c_void_p)
    f64p, ip = ctypes.POINTER(ctypes.c_double), ctypes.POINTER(c_int)
    signatures = {
        "lohan_version": (c_char_p, []),
        "lohan_last_error": (c_char_p, []),
        "lohan_last_error_field": (c_char_p, []),
        "lohan_model_spec_check_settings_json": (c_int, [c_char_p]),
        "lohan_status_name": (c_char_p, [c_int]),
        "lohan_client_connect": (c_int, [c_char_p, pp]),
        "lohan_client_destroy": (None, [c_void_p]),
        "lohan_client_daemon_version": (c_char_p, [c_void_p]),
        "lohan_client_protocol": (None, [c_void_p, ctypes.POINTER(u32),
                                         ctypes.POINTER(u32)]),
        "lohan_client_caller_uid": (u32, [c_void_p]),
        "lohan_client_has_capability": (c_int, [c_void_p, c_char_p]),
        "lohan_job_create": (c_int, [c_void_p, c_char_p, u64, u64, pp]),
        "lohan_job_create_json": (c_int, [c_void_p, c_char_p,
                                          ctypes.POINTER(c_void_p)]),
        "lohan_job_attach": (c_int, [c_void_p, c_char_p, pp]),
        "lohan_job_detach": (c_int, [c_void_p, c_char_p, pp]),
        "lohan_job_delete": (c_int, [c_void_p, c_char_p]),
        "lohan_jobs_list": (c_int, [c_void_p, pp]),
        "lohan_job_list_size": (size_t, [c_void_p]),
        "lohan_job_list_get": (c_void_p, [c_void_p, size_t]),
        "lohan_job_list_destroy": (None, [c_void_p]),
        "lohan_job_info_id": (c_char_p, [c_void_p]),
        "lohan_job_info_name": (c_char_p, [c_void_p]),
        "lohan_job_info_owner_uid": (u32, [c_void_p]),
        "lohan_job_info_state": (c_int, [c_void_p]),
        "lohan_job_info_attached_pid": (i32, [c_void_p]),
        "lohan_job_info_destroy": (None, [c_void_p]),
        "lohan_data_plane_open": (c_int, [c_void_p, c_char_p, pp]),
        "lohan_data_plane_arena": (c_void_p, [c_void_p]),
        "lohan_data_plane_arena_size": (u64, [c_void_p]),
        "lohan_data_plane_destroy": (None, [c_void_p]),
        "lohan_job_open": (c_int, [c_void_p, c_char_p, pp, pp, pp]),
        "lohan_job_reopen_data_plane": (c_int, [c_void_p, c_char_p, pp]),
        "lohan_job_close": (c_int, [c_void_p, c_char_p, c_int]),
        "lohan_model_register": (c_int, [c_void_p, c_void_p, c_char_p,
                                         c_void_p, pp]),
        "lohan_model_register_json": (c_int, [c_void_p, c_void_p, c_char_p,
                                              c_char_p, pp]),
        "lohan_model_destroy": (None, [c_void_p]),
        "lohan_model_grad_slots": (u32, [c_void_p]),
        "lohan_model_weight_slots": (u32, [c_void_p]),
        "lohan_model_iteration": (u64, [c_void_p]),
        "lohan_model_layer_initialized": (c_int, [c_void_p, u32]),
        "lohan_model_previous_commit_kept": (c_int, [c_void_p]),
        "lohan_model_grad_buffer": (c_void_p, [c_void_p, u32]),
        "lohan_model_weight_buffer": (c_void_p, [c_void_p, u32]),
        "lohan_model_layer_bytes": (u64, [c_void_p, u32]),
        "lohan_model_staging": (c_void_p, [c_void_p]),
        "lohan_model_staging_bytes": (u64, [c_void_p]),
        "lohan_model_init_weights": (c_int, [c_void_p, u32]),
        "lohan_model_read_weights": (c_int, [c_void_p, u32]),
        "lohan_model_read_state": (c_int, [c_void_p, u32, c_int]),
        "lohan_model_init_state": (c_int, [c_void_p, u32, c_int]),
        "lohan_model_iter_begin": (c_int, [c_void_p]),
        "lohan_model_iter_begin_with": (c_int, [c_void_p, ctypes.c_float,
                                                ctypes.c_double]),
        "lohan_model_fetch_params": (c_int, [c_void_p, u32]),
        "lohan_model_grad_ready": (c_int, [c_void_p, u32]),
        "lohan_model_activation_buffer": (c_void_p, [c_void_p,
                                                     ctypes.POINTER(u64)]),
        "lohan_model_act_put": (c_int, [c_void_p, u64, u64, u64]),
        "lohan_model_act_get": (c_int, [c_void_p, u64, u64, u64]),
        "lohan_model_act_free": (c_int, [c_void_p, u64]),
        "lohan_model_iter_end": (c_int, [c_void_p,
                                         ctypes.POINTER(ctypes.c_double),
                                         ctypes.POINTER(c_int),
                                         ctypes.POINTER(c_int)]),
        "lohan_model_iter_end_global": (c_int, [
            c_void_p, ctypes.c_double, ctypes.POINTER(ctypes.c_double),
            ctypes.POINTER(c_int), ctypes.POINTER(c_int)]),
        "lohan_model_iter_abort": (c_int, [c_void_p]),
        "lohan_model_await_committed": (c_int, [c_void_p,
                                                ctypes.POINTER(u64)]),
        "lohan_model_release_previous_commit": (c_int, [c_void_p]),
        "lohan_model_arena_asked": (c_int, [c_void_p, ctypes.POINTER(u64)]),
        "lohan_job_follow_share": (c_int, [c_void_p, c_char_p, c_void_p,
                                           c_void_p, ip]),
        "lohan_client_status_json": (c_int, [c_void_p,
                                             ctypes.POINTER(c_void_p)]),
        "lohan_job_plan_json": (c_int, [c_void_p, c_char_p, c_char_p,
                                        ctypes.POINTER(c_void_p)]),
        "lohan_job_kept_plan_json": (c_int, [c_void_p, c_char_p,
                                             ctypes.POINTER(c_void_p)]),
        "lohan_string_free": (None, [c_void_p]),
        # Asynchronous requests: a ticket out, waited for (or polled) later.
        "lohan_model_submit_grad_ready": (c_int, [c_void_p, u32,
                                                  ctypes.POINTER(u64)]),
        "lohan_model_submit_fetch_params": (c_int, [c_void_p, u32,
                                                    ctypes.POINTER(u64)]),
        "lohan_model_submit_act_put": (c_int, [c_void_p, u64, u64, u64,
                                               ctypes.POINTER(u64)]),
        "lohan_model_submit_act_put_from_device": (
            c_int, [c_void_p, u64, u64, u64, c_int, c_void_p, c_void_p,
                    ctypes.POINTER(u64)]),
        "lohan_model_submit_act_get": (c_int, [c_void_p, u64, u64, u64,
                                               ctypes.POINTER(u64)]),
        "lohan_model_submit_act_free": (c_int, [c_void_p, u64,
                                                ctypes.POINTER(u64)]),
        "lohan_model_wait": (c_int, [c_void_p, u64, ctypes.c_int64]),
        "lohan_model_poll": (c_int, [c_void_p, u64, ctypes.POINTER(c_int)]),
        "lohan_model_grad_ready_from_host": (c_int, [c_void_p, u32, c_void_p,
                                                     u64,
                                                     ctypes.POINTER(u64)]),
        "lohan_model_weights_to_host": (c_int, [c_void_p, u32, c_void_p,
                                                u64]),
        "lohan_cuda_built_with": (c_int, []),
        "lohan_cuda_available": (c_int, []),
        "lohan_data_plane_cuda_register": (c_int, [c_void_p]),
        "lohan_model_grad_ready_from_device": (c_int, [c_void_p, u32,
                                                       c_void_p, u64,
                                                       c_void_p,
                                                       ctypes.POINTER(u64)]),
        "lohan_model_weights_to_device": (c_int, [c_void_p, u32, c_void_p,
                                                  u64, c_void_p]),
        "lohan_data_plane_cuda_register_on_device": (c_int, [c_void_p,
                                                             c_int]),
        "lohan_model_grad_ready_from_device_on_device": (
            c_int, [c_void_p, u32, c_int, c_void_p, u64, c_void_p,
                    ctypes.POINTER(u64)]),
        "lohan_model_weights_to_device_on_device": (
            c_int, [c_void_p, u32, c_int, c_void_p, u64, c_void_p]),
        # Checkpoints (lohan_checkpoint.h).
        "lohan_checkpoint_open": (c_int, [c_char_p, u32, pp]),
        "lohan_checkpoint_destroy": (None, [c_void_p]),
        "lohan_model_cut_create": (c_int, [c_char_p, pp]),
        "lohan_model_cut_destroy": (None, [c_void_p]),
        "lohan_model_cut_json": (c_char_p, [c_void_p]),
        "lohan_model_cut_spec_json": (c_char_p, [c_void_p]),
        "lohan_model_cut_layers": (u32, [c_void_p]),
        "lohan_model_cut_layer_block": (i32, [c_void_p, u32]),
        "lohan_model_cut_layer_size": (u32, [c_void_p, u32]),
        "lohan_model_cut_layer_parameter": (c_int, [
            c_void_p, u32, u32, ctypes.POINTER(u32), ctypes.POINTER(u64)]),
        "lohan_steps_create": (c_int, [c_void_p, c_char_p, pp]),
        "lohan_steps_destroy": (None, [c_void_p]),
        "lohan_steps_committed": (u64, [c_void_p]),
        "lohan_steps_active": (c_int, [c_void_p]),
        "lohan_steps_lr": (ctypes.c_double, [c_void_p]),
        "lohan_steps_set_lr": (c_int, [c_void_p, ctypes.c_double]),
        "lohan_steps_loss_scaling_json": (c_int, [c_void_p, pp]),
        "lohan_steps_set_loss_scaling_json": (c_int, [c_void_p, c_char_p]),
        "lohan_steps_scale_loss": (c_int, [c_void_p, f64p]),
        "lohan_steps_begin": (c_int, [c_void_p, f64p]),
        "lohan_steps_claim_grad_buffer": (c_int, [c_void_p, u32]),
        "lohan_steps_grad_ready": (c_int, [c_void_p, u32]),
        "lohan_steps_grad_ready_from_device": (c_int, [
            c_void_p, u32, c_int, c_void_p, u64, c_void_p]),
        "lohan_steps_end": (c_int, [c_void_p, f64p, f64p, ip, ip]),
        "lohan_steps_discard": (c_int, [c_void_p]),
        "lohan_steps_settle": (None, [c_void_p, ctypes.c_int64]),
        "lohan_checkpoint_meta_json": (c_char_p, [c_void_p]),
        "lohan_checkpoint_iteration": (u64, [c_void_p]),
        "lohan_checkpoint_has_part": (c_int, [c_void_p, c_char_p]),
        "lohan_checkpoint_parameters_json": (c_int, [c_void_p, pp]),
        "lohan_checkpoint_shape": (c_int, [
            c_void_p, c_char_p, c_char_p, ctypes.POINTER(ctypes.c_int64),
            size_t, ctypes.POINTER(size_t)]),
        "lohan_checkpoint_read": (c_int, [c_void_p, c_char_p, c_char_p,
                                          c_void_p, u64]),
        "lohan_checkpoint_verify": (c_int, [c_char_p]),
        "lohan_checkpoint_restore_layer": (c_int, [c_void_p, c_void_p,
                                                   c_char_p]),
        "lohan_checkpoint_save_begin": (c_int, [c_char_p, pp]),
        "lohan_checkpoint_save_join": (c_int, [c_char_p, c_char_p, pp]),
        "lohan_checkpoint_save_destroy": (None, [c_void_p]),
        "lohan_checkpoint_save_staging": (c_char_p, [c_void_p]),
        "lohan_checkpoint_save_id": (c_char_p, [c_void_p]),
        "lohan_checkpoint_save_open": (c_int, [c_void_p, c_char_p]),
        "lohan_checkpoint_save_layer_elements": (u64, [c_void_p, u32]),
        "lohan_checkpoint_save_write": (c_int, [c_void_p, u32, c_char_p,
                                                c_void_p, u64]),
        "lohan_checkpoint_save_layer": (c_int, [c_void_p, c_void_p, u32]),
        "lohan_checkpoint_save_close_files": (c_int, [c_void_p, pp]),
        "lohan_checkpoint_save_commit": (c_int, [c_void_p, c_char_p,
                                                 c_char_p]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


_library: Optional[ctypes.CDLL] = None


def library() -> ctypes.CDLL:
    """The loaded client library; raises OSError naming every place tried."""
    global _library
    if _library is not None:
        return _library
    tried = []
    for candidate in _candidates():
        if os.sep in candidate and not os.path.exists(candidate):
            tried.append(f"{candidate} (missing)")
            continue
        try:
            _library = _declare(ctypes.CDLL(candidate))
            return _library
        except OSError as error:
            tried.append(f"{candidate} ({error})")
    raise OSError(
        "cannot load liblohan_client.so; build it (bazel build "
        "//client:liblohan_client.so), install it (scripts/install) or set "
        "LOHAN_CLIENT_LIB. Tried: " + "; ".join(tried))
