"""The Python client (lohan.client over the C ABI) against a real lohand."""

import ctypes
import os
import signal
import time

import pytest

from conftest import Daemon
from lohan import Client, LohanError, StatusCode


class CParamGroup(ctypes.Structure):
    """lohan_param_group from lohan_client.h (the C struct under test; the
    plugin itself describes models in protobuf JSON)."""

    _fields_ = [
        ("lr_scale", ctypes.c_double),
        ("weight_decay", ctypes.c_double),
        ("ranges", ctypes.POINTER(ctypes.c_uint64)),
        ("num_ranges", ctypes.c_uint32),
    ]


class CModelSpec(ctypes.Structure):
    """lohan_model_spec from lohan_client.h (field order matters)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("dtype", ctypes.c_uint32),
        ("layer_elements", ctypes.POINTER(ctypes.c_uint64)),
        ("num_layers", ctypes.c_uint32),
        ("lr", ctypes.c_double),
        ("beta1", ctypes.c_double),
        ("beta2", ctypes.c_double),
        ("eps", ctypes.c_double),
        ("weight_decay", ctypes.c_double),
        ("adamw", ctypes.c_int32),
        ("amsgrad", ctypes.c_int32),
        ("bf16_moments", ctypes.c_int32),
        ("max_grad_norm", ctypes.c_double),
        ("skip_nonfinite", ctypes.c_int32),
        ("chunk_elements", ctypes.c_uint64),
        ("activation_bytes", ctypes.c_uint64),
        # 0.2: streamed layouts (0: one buffer per layer).
        ("grad_slots", ctypes.c_uint32),
        ("weight_slots", ctypes.c_uint32),
        # A new job's starting iteration (a restored checkpoint's step).
        ("initial_iteration", ctypes.c_uint64),
        # Elements without weight decay: (layer, begin, end) triples.
        ("no_weight_decay", ctypes.POINTER(ctypes.c_uint64)),
        ("num_no_weight_decay", ctypes.c_uint32),
        # Param groups with their own lr (a scale of the job's) and decay.
        ("param_groups", ctypes.POINTER(CParamGroup)),
        ("num_param_groups", ctypes.c_uint32),
        # 1: the client fetches each layer before use; iter_end returns
        # before the iteration's last updates are done.
        ("overlap_updates", ctypes.c_int32),
        # 0: deferred (one pass when clipping), 1: redo-all (comparison).
        ("clip_schedule", ctypes.c_uint32),
        # 1: every request served in arrival order (comparison).
        ("in_order_service", ctypes.c_int32),
    ]

def test_hello_and_job_lifecycle(lohand):
    with Client(lohand.socket) as client:
        assert client.daemon_version == "0.1.0"
        assert client.protocol == (1, 0)
        assert client.caller_uid == os.getuid()
        assert client.has_capability("jobs")
        assert not client.has_capability("teleportation")

        job = client.create_job("py-job", host_pool_bytes=1 << 20)
        assert job.name == "py-job" and job.owner_uid == os.getuid()
        assert not job.attached
        attached = client.attach_job(job.id)
        assert attached.attached and attached.attached_pid == os.getpid()
        assert [j.id for j in client.jobs()] == [job.id]

        with pytest.raises(LohanError) as refused:
            client.delete_job(job.id)
        assert refused.value.code == StatusCode.FAILED_PRECONDITION
        assert "detach it first" in refused.value.message

        client.detach_job(job.id)
        status = client.status()
        assert status["daemon_version"] == "0.1.0"
        assert status["config"]["socket_path"] == lohand.socket
        assert status["total_jobs"] == 1
        client.delete_job(job.id)
        assert client.jobs() == []


def test_bad_input_is_a_clear_error(lohand):
    with Client(lohand.socket) as client:
        for bad in ["", "has space", "x" * 65]:
            with pytest.raises(LohanError) as error:
                client.create_job(bad)
            assert error.value.code == StatusCode.INVALID_ARGUMENT
        with pytest.raises(LohanError) as error:
            client.attach_job("j-999999")
        assert error.value.code == StatusCode.NOT_FOUND
        client.create_job("twice")
        with pytest.raises(LohanError) as error:
            client.create_job("twice")
        assert error.value.code == StatusCode.ALREADY_EXISTS
        with pytest.raises(LohanError) as error:
            client.create_job("too-big", host_pool_bytes=1 << 40)
        assert error.value.code == StatusCode.RESOURCE_EXHAUSTED
        # Still serving.
        assert len(client.jobs()) == 1


def test_no_daemon_names_the_socket(tmp_path):
    socket = str(tmp_path / "absent.sock")
    with pytest.raises(LohanError) as error:
        Client(socket)
    assert error.value.code == StatusCode.UNAVAILABLE
    assert socket in error.value.message


def test_daemon_killed_under_a_connected_client(lohand):
    client = Client(lohand.socket)
    job = client.create_job("survivor")
    assert lohand.stop(signal.SIGKILL) == -signal.SIGKILL
    with pytest.raises(LohanError) as error:
        client.jobs()
    assert error.value.code == StatusCode.UNAVAILABLE
    client.close()
    assert job.id == "j-000001"


def test_data_plane_arena_is_shared_memory_returned_on_close(lohand):
    with Client(lohand.socket) as client:
        job = client.create_job("arena", host_pool_bytes=4 << 20)
        with pytest.raises(LohanError) as error:
            client.open_data_plane(job.id)
        assert error.value.code == StatusCode.FAILED_PRECONDITION
        client.attach_job(job.id)
        plane = client.open_data_plane(job.id)
        assert plane.size == 4 << 20
        plane.arena[0:4] = b"lohn"
        plane.arena[-1] = 7
        assert bytes(plane.arena[0:4]) == b"lohn" and plane.arena[-1] == 7
        pool = client.status()["pool"]
        assert int(pool["used_bytes"]) == 4 << 20
        assert pool["arenas"][0]["job_id"] == job.id
        plane.close()
        plane.close()  # idempotent
        for _ in range(3000):
            if int(client.status()["pool"]["used_bytes"]) == 0:
                break
            time.sleep(0.01)
        assert int(client.status()["pool"]["used_bytes"]) == 0


def _train_two_layers(client, dtype, steps, max_grad_norm=0.0, loss_scale=1.0,
                      lr_schedule=None):
    import torch

    torch.manual_seed(0)
    sizes = [10, 7]
    params = [torch.randn(n) for n in sizes]
    reference = [torch.nn.Parameter(p.clone()) for p in params]
    optimizer = torch.optim.AdamW(reference, lr=1e-2, weight_decay=0.01)
    job = client.create_job(
        f"raw-{dtype}-{max_grad_norm}-{loss_scale}-{lr_schedule is None}",
                            host_pool_bytes=1 << 20)
    client.attach_job(job.id)
    plane = client.open_data_plane(job.id)
    model = plane.register_model(job.id, sizes, dtype=dtype, lr=1e-2,
                                 weight_decay=0.01,
                                 max_grad_norm=max_grad_norm)
    assert model.iteration == 0
    staging = torch.frombuffer(model.staging, dtype=torch.float32)
    for layer, p in enumerate(params):
        staging[: p.numel()] = p
        model.init_weights(layer)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    for step in range(steps):
        grads = [torch.randn(n).to(torch_dtype) * (10 if step % 2 else 1)
                 for n in sizes]
        lr = lr_schedule(step) if lr_schedule else None
        if lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        model.iter_begin(grad_scale=1.0 / loss_scale, lr=lr)
        for layer in range(len(sizes)):
            model.fetch_params(layer)
        for layer in reversed(range(len(sizes))):
            buffer = torch.frombuffer(model.grad_buffer(layer), dtype=torch_dtype)
            buffer.copy_(grads[layer] * loss_scale)
            model.grad_ready(layer)
        norm, clipped, skipped = model.iter_end()
        for p, g in zip(reference, grads):
            p.grad = g.float()
        torch_norm = torch.nn.utils.clip_grad_norm_(
            reference, max_grad_norm if max_grad_norm > 0 else float("inf"))
        optimizer.step()
        assert norm == pytest.approx(float(torch_norm), rel=1e-6)
        assert clipped == (max_grad_norm > 0 and float(torch_norm) > max_grad_norm)
        assert not skipped
    masters = []
    for layer, p in enumerate(reference):
        model.read_weights(layer)
        masters.append(staging[: p.numel()].clone())
        if dtype == "bf16":
            published = torch.frombuffer(model.weight_buffer(layer),
                                         dtype=torch.bfloat16)
            assert torch.equal(published, masters[-1].to(torch.bfloat16))
    plane.close()
    return masters, [p.detach() for p in reference]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_raw_model_ops_match_torch_adamw(lohand, dtype):
    import torch

    with Client(lohand.socket) as client:
        ours, theirs = _train_two_layers(client, dtype, steps=4)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_raw_model_ops_unscale_loss_scaled_gradients(lohand):
    """Gradients sent x1024 with grad_scale 1/1024 (fp16 loss scaling) give
    exactly the unscaled run (powers of two scale exactly)."""
    import torch

    with Client(lohand.socket) as client:
        ours, theirs = _train_two_layers(client, "bf16", steps=3,
                                         max_grad_norm=1.0, loss_scale=1024.0)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with Client(lohand.socket) as client:
        job = client.create_job("bad-scale", host_pool_bytes=1 << 20)
        client.attach_job(job.id)
        with client.open_data_plane(job.id) as plane:
            model = plane.register_model(job.id, [4])
            model.init_weights(0)
            for bad in (0.0, -1.0, float("inf"), float("nan")):
                with pytest.raises(LohanError) as error:
                    model.iter_begin(grad_scale=bad)
                assert error.value.code == StatusCode.INVALID_ARGUMENT
            # A rate that is not a number; a negative one means the
            # registered rate (LOHAN_LR_REGISTERED), not an error.
            for bad in (float("inf"), float("nan")):
                with pytest.raises(LohanError) as error:
                    model.iter_begin(grad_scale=0.5, lr=bad)
                assert error.value.code == StatusCode.INVALID_ARGUMENT
                assert "lr must be finite" in error.value.message
            model.iter_begin(grad_scale=0.5, lr=-1.0)  # still usable


def test_raw_model_ops_follow_a_learning_rate_schedule(lohand):
    import torch

    with Client(lohand.socket) as client:
        ours, theirs = _train_two_layers(
            client, "fp32", steps=4,
            # A warm-up from 0, as Trainer's: the first step's rate is 0
            # (the moments move, the weights do not).
            lr_schedule=lambda step: 1e-2 * step / 3)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_raw_model_ops_clip_like_torch(lohand):
    import torch

    with Client(lohand.socket) as client:
        ours, theirs = _train_two_layers(client, "fp32", steps=3,
                                         max_grad_norm=1.0)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_raw_model_ops_refuse_misuse(lohand):
    with Client(lohand.socket) as client:
        job = client.create_job("misuse", host_pool_bytes=1 << 20)
        client.attach_job(job.id)
        with client.open_data_plane(job.id) as plane:
            with pytest.raises(ValueError):
                plane.register_model(job.id, [4], dtype="fp64")
            model = plane.register_model(job.id, [4, 4])
            with pytest.raises(LohanError) as error:
                plane.register_model(job.id, [4, 4])
            assert error.value.code == StatusCode.FAILED_PRECONDITION
            with pytest.raises(LohanError) as error:
                model.grad_ready(0)  # no iteration
            assert error.value.code == StatusCode.FAILED_PRECONDITION
            assert "GRAD_READY: outside ITER_BEGIN..ITER_END" in error.value.message
            with pytest.raises(LohanError) as error:
                model.iter_begin()  # layers have no weights yet
            assert "has no weights yet" in error.value.message
            with pytest.raises(IndexError):
                model.grad_buffer(2)
            for layer in range(2):
                model.init_weights(layer)
            model.iter_begin()
            model.grad_ready(1)
            with pytest.raises(LohanError) as error:
                model.grad_ready(1)  # twice in one iteration
            assert error.value.code in (StatusCode.FAILED_PRECONDITION,
                                        StatusCode.ALREADY_EXISTS)
            model.grad_ready(0)
            model.iter_end()
            # Still serving after the refusals.
            assert client.status()["pool"]["arenas"][0]["job_id"] == job.id


def _step(model, sizes, grads):
    """One iteration through the synchronous Model API with fp32 `grads`."""
    import torch

    model.iter_begin()
    for layer in range(len(sizes)):
        model.fetch_params(layer)
    for layer in reversed(range(len(sizes))):
        torch.frombuffer(model.grad_buffer(layer),
                         dtype=torch.float32).copy_(grads[layer])
        model.grad_ready(layer)
    model.iter_end()


def _read(model, staging, sizes, what):
    """Every layer's master weights (what=None) or Adam moment `what`."""
    out = []
    for layer, n in enumerate(sizes):
        if what is None:
            model.read_weights(layer)
        else:
            model.read_state(layer, what)
        out.append(staging[:n].clone())
    return out


def test_optimizer_states_read_and_restored_into_a_job_at_a_step(lohand):
    """read_state gives torch AdamW's exp_avg / exp_avg_sq; a new job
    registered at initial_iteration=2 with those moments (init_state) and
    the weights continues bit for bit like the original."""
    import torch

    torch.manual_seed(3)
    sizes = [12, 5]
    params = [torch.randn(n) for n in sizes]
    # Positive gradients: the moments never cancel, so a relative
    # comparison is meaningful everywhere.
    grads = [[torch.rand(n) + 0.1 for n in sizes] for _ in range(3)]
    reference = [torch.nn.Parameter(p.clone()) for p in params]
    optimizer = torch.optim.AdamW(reference, lr=1e-2, weight_decay=0.01)
    with Client(lohand.socket) as client:
        job = client.create_job("states-a", host_pool_bytes=1 << 20)
        client.attach_job(job.id)
        plane = client.open_data_plane(job.id)
        model = plane.register_model(job.id, sizes, lr=1e-2,
                                     weight_decay=0.01)
        staging = torch.frombuffer(model.staging, dtype=torch.float32)
        for layer, p in enumerate(params):
            staging[: p.numel()] = p
            model.init_weights(layer)
            model.read_state(layer, "exp_avg")
            assert bool((staging[: p.numel()] == 0).all())
        for step in range(2):
            _step(model, sizes, grads[step])
            for p, g in zip(reference, grads[step]):
                p.grad = g.clone()
            optimizer.step()
        weights = _read(model, staging, sizes, None)
        exp_avg = _read(model, staging, sizes, "exp_avg")
        exp_avg_sq = _read(model, staging, sizes, "exp_avg_sq")
        for layer, p in enumerate(reference):
            state = optimizer.state[p]
            torch.testing.assert_close(exp_avg[layer], state["exp_avg"],
                                       rtol=1e-6, atol=0)
            torch.testing.assert_close(exp_avg_sq[layer],
                                       state["exp_avg_sq"], rtol=1e-6, atol=0)
            torch.testing.assert_close(weights[layer], p.detach(),
                                       rtol=1e-5, atol=1e-6)
        for bad in ("max_exp_avg_sq",):  # not an AMSGrad job
            with pytest.raises(LohanError) as error:
                model.read_state(0, bad)
            assert error.value.code == StatusCode.INVALID_ARGUMENT
        for bad in ("exp_avg_sqr", "", 1):
            with pytest.raises(ValueError):
                model.read_state(0, bad)
            with pytest.raises(ValueError):
                model.init_state(0, bad)

        restored = client.create_job("states-b", host_pool_bytes=1 << 20)
        client.attach_job(restored.id)
        plane_b = client.open_data_plane(restored.id)
        model_b = plane_b.register_model(restored.id, sizes, lr=1e-2,
                                         weight_decay=0.01,
                                         initial_iteration=2)
        assert model_b.iteration == 2
        staging_b = torch.frombuffer(model_b.staging, dtype=torch.float32)
        with pytest.raises(LohanError) as error:
            model_b.init_state(0, "exp_avg")  # no weights yet
        assert error.value.code == StatusCode.FAILED_PRECONDITION
        for layer, n in enumerate(sizes):
            staging_b[:n] = weights[layer]
            model_b.init_weights(layer)
            staging_b[:n] = exp_avg[layer]
            model_b.init_state(layer, "exp_avg")
            staging_b[:n] = exp_avg_sq[layer]
            model_b.init_state(layer, "exp_avg_sq")
        assert torch.equal(torch.cat(_read(model_b, staging_b, sizes,
                                           "exp_avg_sq")),
                           torch.cat(exp_avg_sq))
        # One more iteration on each, the same gradient: Adam step 3 both.
        _step(model, sizes, grads[2])
        _step(model_b, sizes, grads[2])
        a = torch.cat(_read(model, staging, sizes, None))
        b = torch.cat(_read(model_b, staging_b, sizes, None))
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
        for part in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.cat(_read(model, staging, sizes, part)),
                               torch.cat(_read(model_b, staging_b, sizes,
                                               part)))
        for p, g in zip(reference, grads[2]):
            p.grad = g.clone()
        optimizer.step()
        torch.testing.assert_close(
            a, torch.cat([p.detach() for p in reference]), rtol=1e-5,
            atol=1e-6)
        del staging, staging_b
        plane.close()
        plane_b.close()


def test_activation_swap_through_the_daemon(lohand):
    import torch

    with Client(lohand.socket) as client:
        job = client.create_job("acts", host_pool_bytes=2 << 20)
        client.attach_job(job.id)
        with client.open_data_plane(job.id) as plane:
            model = plane.register_model(job.id, [8],
                                         activation_bytes=64 << 10)
            area = torch.frombuffer(model.activations, dtype=torch.float32)
            first = torch.randn(1000)
            second = torch.randn(3000)
            area[:1000] = first
            model.act_put(1, 0, 4000)
            area[:3000] = second  # the area is free for the next one
            model.act_put(2, 0, 12000)
            area.zero_()
            model.act_get(1, 40000, 4000)
            assert torch.equal(area[10000:11000], first)
            model.act_get(2, 0, 12000)
            assert torch.equal(area[:3000], second)
            model.act_free(1)
            for bad, code in [
                (lambda: model.act_get(1, 0, 4000), StatusCode.NOT_FOUND),
                (lambda: model.act_put(2, 0, 8), StatusCode.ALREADY_EXISTS),
                (lambda: model.act_get(2, 0, 8), StatusCode.INVALID_ARGUMENT),
                (lambda: model.act_put(3, 60 << 10, 8 << 10),
                 StatusCode.INVALID_ARGUMENT),
            ]:
                with pytest.raises(LohanError) as error:
                    bad()
                assert error.value.code == code, error.value
            assert client.status()["store"]["tensors"] != "0"
        # Closing the data plane drops the swapped activations.
        for _ in range(3000):
            status = client.status()
            if int(status["pool"]["used_bytes"]) == 0:
                break
            time.sleep(0.01)
        tensors_left = int(client.status()["store"]["tensors"])
        # Only the model's own states remain: one chunk + meta.
        assert tensors_left == 2


def test_an_activation_the_ssds_cannot_hold_is_refused_and_can_be_retried(
        tmp_path):
    """A put the store refuses (no room on the SSDs) leaves nothing held:
    the same id can be put again, smaller, and read back."""
    import torch

    daemon = Daemon(tmp_path, ssd_capacity="2MiB")
    try:
        with Client(daemon.socket) as client:
            job = client.create_job("full", host_pool_bytes=8 << 20)
            client.attach_job(job.id)
            with client.open_data_plane(job.id) as plane:
                model = plane.register_model(job.id, [8],
                                             activation_bytes=4 << 20)
                area = torch.frombuffer(model.activations, dtype=torch.uint8)
                with pytest.raises(LohanError) as error:
                    model.act_put(5, 0, 4 << 20)
                assert error.value.code == StatusCode.RESOURCE_EXHAUSTED, (
                    error.value)
                with pytest.raises(LohanError) as error:
                    model.act_get(5, 0, 4 << 20)
                assert error.value.code == StatusCode.NOT_FOUND, error.value
                area[:4096] = 7
                model.act_put(5, 0, 4096)
                area[:4096] = 0
                model.act_get(5, 0, 4096)
                assert bool((area[:4096] == 7).all())
    finally:
        daemon.stop()


def test_streamed_slots_alias_one_buffer(lohand):
    """grad_slots=1, weight_slots=1: every layer's buffers are slot 0; one
    iteration through them matches torch's AdamW. A caller built against
    the older, smaller lohan_model_spec gets the resident layout."""
    import ctypes

    import torch

    from lohan import _native

    sizes = [10, 7, 5]
    with Client(lohand.socket) as client:
        job = client.create_job("streamed", host_pool_bytes=1 << 20)
        client.attach_job(job.id)
        with client.open_data_plane(job.id) as plane:
            model = plane.register_model(job.id, sizes, dtype="bf16", lr=1e-2,
                                         grad_slots=1, weight_slots=1)
            address = ctypes.addressof

            def base(view):
                return address(ctypes.c_uint8.from_buffer(view))

            grads = {base(model.grad_buffer(l)) for l in range(3)}
            weights = {base(model.weight_buffer(l)) for l in range(3)}
            assert len(grads) == 1 and len(weights) == 1
            assert grads != weights
            assert len(model.grad_buffer(2)) == 5 * 2  # the layer's bytes
            session = client.status()["sessions"][0]
            assert (session["grad_slots"], session["weight_slots"]) == (1, 1)

            torch.manual_seed(0)
            params = [torch.randn(n) for n in sizes]
            reference = [torch.nn.Parameter(p.clone()) for p in params]
            optimizer = torch.optim.AdamW(reference, lr=1e-2,
                                          weight_decay=0.0)
            staging = torch.frombuffer(model.staging, dtype=torch.float32)
            for layer, p in enumerate(params):
                staging[: p.numel()] = p
                model.init_weights(layer)
            model.iter_begin()
            for layer, p in enumerate(params):
                model.fetch_params(layer)
                fetched = torch.frombuffer(model.weight_buffer(layer),
                                           dtype=torch.bfloat16)
                assert torch.equal(fetched, p.to(torch.bfloat16))
            grad_values = [torch.randn(n).to(torch.bfloat16) for n in sizes]
            for layer in reversed(range(3)):
                torch.frombuffer(model.grad_buffer(layer),
                                 dtype=torch.bfloat16).copy_(grad_values[layer])
                model.grad_ready(layer)  # completion: the buffer is free
            model.iter_end()
            for p, g in zip(reference, grad_values):
                p.grad = g.float()
            optimizer.step()
            for layer, p in enumerate(reference):
                model.read_weights(layer)
                torch.testing.assert_close(staging[: p.numel()], p.detach(),
                                           rtol=1e-5, atol=1e-6)

        # The spec as an older library knew it: struct_size ends before
        # grad_slots, so the (nonzero) bytes beyond it are not read.
        old = client.create_job("old-spec", host_pool_bytes=1 << 20)
        client.attach_job(old.id)
        with client.open_data_plane(old.id) as plane:
            lib = _native.library()
            elements = (ctypes.c_uint64 * 3)(*sizes)
            spec = CModelSpec(
                struct_size=CModelSpec.grad_slots.offset, dtype=2,
                layer_elements=elements, num_layers=3, lr=1e-3, beta1=0.9,
                beta2=0.999, eps=1e-8, grad_slots=1, weight_slots=1)
            handle = ctypes.c_void_p()
            assert lib.lohan_model_register(
                client._handle, plane._handle, old.id.encode(),
                ctypes.byref(spec), ctypes.byref(handle)) == 0
            distinct = {lib.lohan_model_grad_buffer(handle, l)
                        for l in range(3)}
            assert len(distinct) == 3  # resident
            lib.lohan_model_destroy(handle)


def test_no_weight_decay_ranges_match_torch_param_groups(lohand):
    """A 1-layer fp32 model with exempt ranges (no_weight_decay): those
    elements follow torch AdamW with weight_decay=0, the rest AdamW with the
    decay, as torch's usual two param groups. Bad ranges and a NULL array
    with a count are INVALID_ARGUMENT; a spec that ends before the fields
    has none."""
    import ctypes

    import torch

    from lohan import _native

    n = 40
    exempt = [(0, 30, 40), (0, 3, 9)]  # any order; one at the layer's end
    torch.manual_seed(3)
    initial = torch.randn(n)
    grads = [torch.randn(n), torch.randn(n) * 3]
    lr, wd = 1e-2, 0.1

    # torch: the layer cut into its pieces (begin, end, decayed), the
    # exempt ones in a param group with weight_decay=0.
    cuts = [(0, 3, True), (3, 9, False), (9, 30, True), (30, 40, False)]
    pieces = [torch.nn.Parameter(initial[a:b].clone()) for a, b, _ in cuts]
    optimizer = torch.optim.AdamW(
        [{"params": [p for p, c in zip(pieces, cuts) if c[2]],
          "weight_decay": wd},
         {"params": [p for p, c in zip(pieces, cuts) if not c[2]],
          "weight_decay": 0.0}], lr=lr)
    everywhere = torch.nn.Parameter(initial.clone())  # decay on every element
    decayed_all = torch.optim.AdamW([everywhere], lr=lr, weight_decay=wd)

    with Client(lohand.socket) as client:
        job = client.create_job("no-decay", host_pool_bytes=1 << 20)
        client.attach_job(job.id)
        with client.open_data_plane(job.id) as plane:
            model = plane.register_model(job.id, [n], lr=lr, weight_decay=wd,
                                         no_weight_decay=exempt)
            staging = torch.frombuffer(model.staging, dtype=torch.float32)
            staging[:n] = initial
            model.init_weights(0)
            for g in grads:
                _step(model, [n], [g])
                for p, (a, b, _) in zip(pieces, cuts):
                    p.grad = g[a:b].clone()
                optimizer.step()
                everywhere.grad = g.clone()
                decayed_all.step()
            ours = _read(model, staging, [n], None)[0]
        expected = torch.cat([p.detach() for p in pieces])
        torch.testing.assert_close(ours, expected, rtol=1e-6, atol=0.0)
        mask = torch.zeros(n, dtype=torch.bool)
        mask[3:9] = True
        mask[30:40] = True
        # The decay made a difference where it was applied, and only there.
        assert not torch.isclose(ours[mask], everywhere.detach()[mask],
                                 rtol=1e-5, atol=0.0).any()
        torch.testing.assert_close(ours[~mask], everywhere.detach()[~mask],
                                   rtol=1e-6, atol=0.0)

        refused = client.create_job("no-decay-bad", host_pool_bytes=1 << 20)
        client.attach_job(refused.id)
        with client.open_data_plane(refused.id) as plane:
            for ranges, text in [
                    ([(1, 0, 1)], "(layer 1, [0, 1)): the model has 1 layers"),
                    ([(0, 4, 4)], "[4, 4) of layer 0 is empty"),
                    ([(0, 0, 41)], "ends past the layer's 40 elements"),
                    ([(0, 10, 20), (0, 5, 11)],
                     "[10, 20) of layer 0 overlaps [5, 11)")]:
                with pytest.raises(LohanError) as error:
                    plane.register_model(refused.id, [n], weight_decay=wd,
                                         no_weight_decay=ranges)
                assert error.value.code == StatusCode.INVALID_ARGUMENT
                assert text in error.value.message
            with pytest.raises(ValueError):
                plane.register_model(refused.id, [n],
                                     no_weight_decay=[(0, -1, 3)])

            lib = _native.library()
            elements = (ctypes.c_uint64 * 1)(n)

            def raw(struct_size):
                spec = CModelSpec(
                    struct_size=struct_size, dtype=1, layer_elements=elements,
                    num_layers=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                    num_no_weight_decay=2)  # no_weight_decay left NULL
                handle = ctypes.c_void_p()
                status = lib.lohan_model_register(
                    client._handle, plane._handle, refused.id.encode(),
                    ctypes.byref(spec), ctypes.byref(handle))
                return status, handle

            status, _ = raw(ctypes.sizeof(CModelSpec))
            assert status == StatusCode.INVALID_ARGUMENT
            assert b"no_weight_decay is NULL" in lib.lohan_last_error()

            # Param groups: NULL arrays with counts, bad values.
            def with_groups(groups, count):
                spec = CModelSpec(
                    struct_size=ctypes.sizeof(CModelSpec), dtype=1,
                    layer_elements=elements, num_layers=1, lr=1e-3,
                    beta1=0.9, beta2=0.999, eps=1e-8, param_groups=groups,
                    num_param_groups=count)
                handle = ctypes.c_void_p()
                status = lib.lohan_model_register(
                    client._handle, plane._handle, refused.id.encode(),
                    ctypes.byref(spec), ctypes.byref(handle))
                return status, handle

            status, _ = with_groups(None, 1)
            assert status == StatusCode.INVALID_ARGUMENT
            assert b"param_groups is NULL" in lib.lohan_last_error()
            no_ranges = (CParamGroup * 1)(CParamGroup(
                lr_scale=2.0, weight_decay=0.0, num_ranges=3))
            status, _ = with_groups(no_ranges, 1)
            assert status == StatusCode.INVALID_ARGUMENT
            assert b"param_groups[0].ranges is NULL" in lib.lohan_last_error()
            for groups, text in [
                    ([(-1.0, 0.0, [(0, 0, 5)])], "has lr_scale -1"),
                    ([(1.0, 0.1, [(0, 0, 5)]), (2.0, 0.0, [(0, 4, 9)])],
                     "param_groups[1] range [4, 9) of layer 0 overlaps"),
                    ([(1.0, 0.0, [(3, 0, 5)])], "the model has 1 layers")]:
                with pytest.raises(LohanError) as error:
                    plane.register_model(refused.id, [n], param_groups=groups)
                assert error.value.code == StatusCode.INVALID_ARGUMENT
                assert text in error.value.message, error.value.message
            with pytest.raises(ValueError):
                plane.register_model(refused.id, [n],
                                     param_groups=[(1.0, 0.0, [(0, -2, 3)])])
            # A clip schedule lohand does not know, past the Python
            # check: refused by liblohan_client with lohand's rule, naming
            # the field.
            spec = CModelSpec(
                struct_size=ctypes.sizeof(CModelSpec), dtype=1,
                layer_elements=elements, num_layers=1, lr=1e-3, beta1=0.9,
                beta2=0.999, eps=1e-8, clip_schedule=7)
            handle = ctypes.c_void_p()
            status = lib.lohan_model_register(
                client._handle, plane._handle, refused.id.encode(),
                ctypes.byref(spec), ctypes.byref(handle))
            assert status == StatusCode.INVALID_ARGUMENT
            assert b"clip_schedule 7 is not 0 (deferred) or 1" in (
                lib.lohan_last_error())
            assert lib.lohan_last_error_field() == b"clip_schedule"
            with pytest.raises(ValueError, match="clip_schedule"):
                plane.register_model(refused.id, [n], clip_schedule="fast")
            # An older caller's spec ends before the new fields: none of
            # them (and, after all the refusals above, it registers).
            status, handle = raw(CModelSpec.no_weight_decay.offset)
            assert status == 0, lib.lohan_last_error()
            lib.lohan_model_destroy(handle)


def test_async_requests_many_in_flight_waited_in_reverse(lohand):
    """submit_* return tickets at once; several in flight, waited for in
    reverse order; failures land on their own ticket with their own text."""
    import torch

    with Client(lohand.socket) as client:
        job = client.create_job("async", host_pool_bytes=2 << 20)
        client.attach_job(job.id)
        with client.open_data_plane(job.id) as plane:
            sizes = [16, 8]
            model = plane.register_model(job.id, sizes,
                                         activation_bytes=64 << 10)
            staging = torch.frombuffer(model.staging, dtype=torch.float32)
            for layer, n in enumerate(sizes):
                staging[:n] = torch.arange(n, dtype=torch.float32)
                model.init_weights(layer)
            area = torch.frombuffer(model.activations, dtype=torch.uint8)
            for i in range(4):
                area[i * 1024:(i + 1) * 1024] = i + 1
            model.iter_begin()
            tickets = []
            for i in range(4):
                tickets.append(("put", i, model.submit_act_put(
                    i, i * 1024, 1024)))
                tickets.append(("free-unheld", i,
                                model.submit_act_free(100 + i)))
            for layer in range(len(sizes)):
                tickets.append(("fetch", layer,
                                model.submit_fetch_params(layer)))
            for layer in reversed(range(len(sizes))):
                grad = torch.full((sizes[layer],), 0.5)
                tickets.append(("grad", layer, model.grad_ready_from_host(
                    layer, grad.data_ptr(), grad.numel() * 4)))
            assert len({t for _, _, t in tickets}) == len(tickets)
            for kind, i, ticket in reversed(tickets):
                if kind == "free-unheld":
                    with pytest.raises(LohanError) as error:
                        model.wait(ticket)
                    assert error.value.code == StatusCode.NOT_FOUND
                    assert f"activation {100 + i} is not held" in \
                        error.value.message
                else:
                    model.wait(ticket)
                # Consumed: a second wait names the ticket.
                with pytest.raises(LohanError) as error:
                    model.wait(ticket)
                assert error.value.code == StatusCode.NOT_FOUND
                assert f"ticket {ticket} was already waited for" in \
                    error.value.message
            model.iter_end()
            # Every activation back at once, polled, then waited for.
            area.zero_()
            gets = [model.submit_act_get(i, i * 1024, 1024) for i in range(4)]
            for ticket in gets:
                while not model.poll(ticket):
                    time.sleep(0.001)
            for i, ticket in reversed(list(enumerate(gets))):
                model.wait(ticket, timeout=30)
                assert bool((area[i * 1024:(i + 1) * 1024] == i + 1).all())
            frees = [model.submit_act_free(i) for i in range(4)]
            for ticket in frees:
                model.wait(ticket)
            with pytest.raises(LohanError) as error:
                model.wait(10 ** 9)
            assert error.value.code == StatusCode.INVALID_ARGUMENT
            # No GPU use here: the reason is given, the device call refused.
            available, reason = model.cuda_available()
            if not available:
                assert reason
                with pytest.raises(LohanError) as error:
                    model.grad_ready_from_device(0, 1, 64)
                assert error.value.code in (StatusCode.FAILED_PRECONDITION,
                                            StatusCode.UNIMPLEMENTED)
                # So are the forms naming the device.
                refused = (StatusCode.FAILED_PRECONDITION,
                           StatusCode.UNIMPLEMENTED)
                for call in (
                        lambda: model.grad_ready_from_device(0, 1, 64,
                                                             device=0),
                        lambda: model.weights_to_device(0, 1, 64, device=0),
                        lambda: plane.cuda_register(device=0)):
                    with pytest.raises(LohanError) as error:
                        call()
                    assert error.value.code in refused
            # A negative device index is refused whatever the machine.
            with pytest.raises(LohanError) as error:
                model.grad_ready_from_device(0, 1, 64, device=-1)
            assert error.value.code == StatusCode.INVALID_ARGUMENT
            with pytest.raises(LohanError) as error:
                plane.cuda_register(device=-1)
            assert error.value.code == StatusCode.INVALID_ARGUMENT


def test_iter_abort_outside_an_iteration_is_refused_and_inside_rolls_back(
        lohand):
    """ITER_ABORT with no iteration begun: FAILED_PRECONDITION, the session
    serves on. Inside one, after some gradients were taken: the weights are
    the committed ones and the next iteration is step 1 again."""
    import torch

    sizes = [8, 4]
    with Client(lohand.socket) as client:
        job = client.create_job("abort", host_pool_bytes=1 << 20)
        client.attach_job(job.id)
        with client.open_data_plane(job.id) as plane:
            model = plane.register_model(job.id, sizes, lr=0.1)
            staging = torch.frombuffer(model.staging, dtype=torch.float32)
            for layer, n in enumerate(sizes):
                staging[:n] = torch.arange(n, dtype=torch.float32)
                model.init_weights(layer)
            with pytest.raises(LohanError) as refused:
                model.iter_abort()
            assert refused.value.code == StatusCode.FAILED_PRECONDITION
            model.iter_begin()
            torch.frombuffer(model.grad_buffer(1), dtype=torch.float32)[:] = 1
            model.grad_ready(1)
            model.iter_abort()
            for layer, n in enumerate(sizes):
                model.read_weights(layer)
                assert torch.equal(staging[:n],
                                   torch.arange(n, dtype=torch.float32))
            model.iter_begin()  # numbered after the aborted one
            for layer in (1, 0):
                torch.frombuffer(model.grad_buffer(layer),
                                 dtype=torch.float32)[:] = 1
                model.grad_ready(layer)
            norm, clipped, skipped = model.iter_end()
            assert not skipped and norm == pytest.approx(12 ** 0.5)
            model.read_weights(1)
            # Adam's first step moves every weight by lr (bias-corrected).
            assert torch.allclose(staging[:4], torch.arange(4.0) - 0.1)
            model.close()
        client.detach_job(job.id)


def test_a_job_with_an_open_data_plane_is_not_deleted(lohand):
    """Deleting frees the job's SSD space, which its open session still
    uses: refused until the data plane is closed."""
    with Client(lohand.socket) as client:
        job = client.create_job("busy", host_pool_bytes=1 << 20)
        client.attach_job(job.id)
        plane = client.open_data_plane(job.id)
        plane.register_model(job.id, [16])
        client.detach_job(job.id)
        with pytest.raises(LohanError) as refused:
            client.delete_job(job.id)
        assert refused.value.code == StatusCode.FAILED_PRECONDITION
        assert "open data plane" in refused.value.message
        plane.close()
        deadline = time.monotonic() + 30
        while True:  # the daemon sees the connection close
            try:
                client.delete_job(job.id)
                break
            except LohanError as error:
                if time.monotonic() > deadline:
                    raise
                assert error.code == StatusCode.FAILED_PRECONDITION
                time.sleep(0.01)
        assert all(j.id != job.id for j in client.jobs())


def test_open_job_finds_or_creates_and_close_gives_everything_back(lohand):
    """lohan_job_open / lohan_job_reopen_data_plane / lohan_job_close, the
    job's lifecycle both plugins run: a new job is created, attached and
    mapped in one call; a taken name, a missing job to resume and a bad
    request are refused with nothing left behind; close waits for the
    arena's return, so the job reopens at once, and deletes on request."""
    from lohan.model_spec import ModelSpec
    spec = ModelSpec(layer_elements=[1000, 3000])
    with Client(lohand.socket) as client:
        job, created, sizing, plane = client.open_job("life", spec, False)
        assert created and sizing.arena_bytes == plane.size > 0
        assert client.jobs()[0].attached
        with pytest.raises(LohanError) as taken:
            client.open_job("life", spec, False)
        assert taken.value.code == StatusCode.ALREADY_EXISTS
        with pytest.raises(LohanError) as missing:
            client.open_job("absent", spec, True)
        assert missing.value.code == StatusCode.NOT_FOUND
        assert "no job named \"absent\"" in missing.value.message
        status = client._lib.lohan_job_open(
            client._handle, b"{\"spec\": 7}", ctypes.byref(ctypes.c_void_p()),
            None, None)
        assert status == StatusCode.INVALID_ARGUMENT
        assert [j.name for j in client.jobs()] == ["life"]
        # The plane closed and at once another: the arena came back first.
        plane.close()
        plane = client.reopen_data_plane(job.id)
        plane.close()
        client.close_job(job.id, delete=False)
        assert not client.jobs()[0].attached
        found, created, _, plane = client.open_job("life", spec, True)
        assert found.id == job.id and not created
        plane.close()
        client.close_job(job.id, delete=True)
        assert client.jobs() == []
        assert client.status()["pool"].get("arenas", []) == []


def test_the_step_and_cut_calls_refuse_bad_input_and_keep_serving(lohand):
    """liblohan_client's lohan_model_cut_* and lohan_steps_* given NULLs,
    malformed JSON, values out of range or calls out of order: each a
    clear error and no crash; the model then trains a step as usual."""
    from lohan import _native
    from lohan.steps import TrainingSteps

    lib = _native.library()
    out = ctypes.c_void_p()
    bad = StatusCode.INVALID_ARGUMENT
    assert lib.lohan_model_cut_create(None, ctypes.byref(out)) == bad
    assert lib.lohan_model_cut_create(b"{\"parameters\": 7",
                                      ctypes.byref(out)) == bad
    assert b"ModelDescription" in lib.lohan_last_error()
    assert lib.lohan_model_cut_create(b"{}", ctypes.byref(out)) == bad
    assert b"no trainable parameters" in lib.lohan_last_error()
    assert lib.lohan_model_cut_create(
        b"{\"parameters\": [{\"name\": \"w\", \"shape\": [2, 3]}]}",
        ctypes.byref(out)) == 0
    cut = out.value
    assert lib.lohan_model_cut_layers(cut) == 1
    assert lib.lohan_model_cut_layer_block(cut, 5) == -1
    assert lib.lohan_model_cut_layer_size(cut, 5) == 0
    index, offset = ctypes.c_uint32(), ctypes.c_uint64()
    assert lib.lohan_model_cut_layer_parameter(
        cut, 0, 1, ctypes.byref(index), ctypes.byref(offset)) == \
        StatusCode.OUT_OF_RANGE
    assert lib.lohan_model_cut_layer_parameter(cut, 0, 0, None, None) == bad
    lib.lohan_model_cut_destroy(cut)
    lib.lohan_model_cut_destroy(None)
    assert lib.lohan_model_cut_layers(None) == 0

    assert lib.lohan_steps_create(None, b"{}", ctypes.byref(out)) == bad
    for call in (lambda: lib.lohan_steps_begin(None, None),
                 lambda: lib.lohan_steps_grad_ready(None, 0),
                 lambda: lib.lohan_steps_claim_grad_buffer(None, 0),
                 lambda: lib.lohan_steps_end(None, None, None, None, None),
                 lambda: lib.lohan_steps_discard(None),
                 lambda: lib.lohan_steps_set_lr(None, 0.1)):
        assert call() == bad
    assert lib.lohan_steps_committed(None) == 0
    lib.lohan_steps_settle(None, 0)
    lib.lohan_steps_destroy(None)

    with Client(lohand.socket) as client:
        job = client.create_job("bad-steps", host_pool_bytes=1 << 20)
        client.attach_job(job.id)
        with client.open_data_plane(job.id) as plane:
            model = plane.register_model(job.id, [4, 4])
            for layer in range(2):
                model.init_weights(layer)
            assert lib.lohan_steps_create(model._handle, b"{\"lr\": ",
                                          ctypes.byref(out)) == bad
            assert b"TrainingStepsOptions" in lib.lohan_last_error()
            with pytest.raises(LohanError, match="learning rate"):
                TrainingSteps(model, -1.0, {"scale": 1.0})
            with pytest.raises(LohanError, match="loss_scaling.scale"):
                TrainingSteps(model, 0.01, {"scale": float("inf")})
            steps = TrainingSteps(model, 0.01, {"scale": 1.0})
            with pytest.raises(LohanError, match="begin it first") as error:
                steps.grad_ready(0)
            assert error.value.code == StatusCode.FAILED_PRECONDITION
            with pytest.raises(LohanError, match="no step in progress"):
                steps.end()
            with pytest.raises(LohanError, match="learning rate"):
                steps.begin(float("nan"))
            with pytest.raises(LohanError, match="growth_interval"):
                steps.set_loss_scaling(dynamic=True, growth_interval=0)
            assert not steps.active and steps.committed == 0
            assert lib.lohan_steps_set_lr(steps._handle, -2.0) == bad
            steps.begin(0.01)
            assert lib.lohan_steps_lr(steps._handle) == 0.01
            with pytest.raises(LohanError, match="out of range"):
                steps.claim_grad_buffer(9)
            assert lib.lohan_steps_grad_ready_from_device(
                steps._handle, 0, 0, None, 16, None) == bad
            steps.grad_ready(0)
            steps.grad_ready(1)
            _, clipped, skipped = steps.end()
            assert not skipped and steps.committed == 1
            steps.close()
