"""Model.arena_asked and Client.follow_share (lohan_model_arena_asked,
lohan_job_follow_share) against a real lohand that asks nothing of a job
alone on its pool: nothing moves and every view stays. The moves
themselves: tests/share_move_test.cc and client/share_move_test.cc."""

import pytest

from lohan import Client, LohanError, StatusCode
from lohan.model_spec import ModelSpec


def test_follow_share_moves_nothing_while_nothing_is_asked(lohand):
    spec = ModelSpec(layer_elements=[1000, 3000])
    with Client(lohand.socket) as client:
        job, _, _, plane = client.open_job("share", spec, False)
        model = plane.register_model(job.id, spec)
        assert model.arena_asked == 0
        for layer in range(model.num_layers):
            model.init_weights(layer)
        for _ in range(2):
            model.iter_begin()
            for layer in range(model.num_layers):
                model.fetch_params(layer)
                model.grad_ready(layer)
            model.iter_end()
            assert model.arena_asked == 0
            arena, staging = plane.arena, model.staging
            assert client.follow_share(job.id, plane, model) is False
            assert plane.arena is arena and model.staging is staging
        # The plane is still the one the model trains on.
        model.iter_begin()
        model.iter_abort()
        model.close()
        with pytest.raises(LohanError) as closed:
            model.arena_asked  # noqa: B018: the property calls the library
        assert closed.value.code == StatusCode.INVALID_ARGUMENT
        with pytest.raises(LohanError) as refused:
            client.follow_share(job.id, plane, model)
        assert refused.value.code == StatusCode.INVALID_ARGUMENT
        assert "lohan_job_follow_share" in refused.value.message
        plane.close()
        client.close_job(job.id, delete=True)
