#include "daemon/session/arena_layout.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace lohan {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

uint64_t RoundUp(uint64_t value, uint64_t unit) {
  return (value + unit - 1) / unit * unit;
}

std::string MiB(uint64_t bytes) { return absl::StrCat(bytes >> 20, " MiB"); }

}  // namespace

ArenaShape ShapeOf(const v1::ModelSpec& spec) {
  return ArenaShape{
      .layer_elements = {spec.layer_elements().begin(),
                         spec.layer_elements().end()},
      .element_bytes = spec.dtype() == v1::DTYPE_FP32 ? 4u : 2u,
      .activation_bytes = spec.activation_bytes(),
      .grad_buffers = spec.grad_slots(),
      .weight_buffers = spec.weight_slots(),
  };
}

namespace {

// The most shared buffers of each kind ARENA_FIT_MOST may stream `spec`
// through (0: it cannot stream).
uint64_t MostStreamed(const v1::ModelSpec& spec) {
  const uint64_t layers = spec.layer_elements_size();
  return layers == 0 ? 0 : std::min<uint64_t>(spec.grad_slots(), layers - 1);
}

}  // namespace

v1::ModelSpec ArenaFieldsOf(const v1::ModelSpec& spec) {
  v1::ModelSpec kept;
  *kept.mutable_layer_elements() = spec.layer_elements();
  kept.set_dtype(spec.dtype());
  kept.set_activation_bytes(spec.activation_bytes());
  kept.set_grad_slots(spec.grad_slots());
  kept.set_weight_slots(spec.weight_slots());
  kept.set_arena_fit(spec.arena_fit());
  return kept;
}

uint64_t SmallestArena(const v1::ModelSpec& spec) {
  ArenaShape shape = ShapeOf(spec);
  if (spec.arena_fit() != v1::ARENA_FIT_AS_GIVEN) {
    const uint64_t buffers = MostStreamed(spec) >= 1 ? 1 : 0;
    shape.grad_buffers = shape.weight_buffers = buffers;
  }
  return ArenaBytes(shape);
}

absl::StatusOr<ArenaChoice> ChooseArena(const v1::ModelSpec& spec,
                                        const ArenaLimit& limit) {
  ArenaShape shape = ShapeOf(spec);
  const size_t layers = shape.layer_elements.size();
  auto with_buffers = [&](uint64_t grad, uint64_t weight) {
    shape.grad_buffers = grad;
    shape.weight_buffers = weight;
    return ArenaBytes(shape);
  };
  auto count = [&](uint64_t buffers) {
    return StreamedBuffers(buffers, layers) ? static_cast<uint32_t>(buffers)
                                            : 0u;
  };
  ArenaChoice choice{.resident_arena_bytes = with_buffers(0, 0)};
  if (spec.arena_fit() == v1::ARENA_FIT_AS_GIVEN) {
    choice.grad_buffers = count(spec.grad_slots());
    choice.weight_buffers = count(spec.weight_slots());
    choice.arena_bytes = with_buffers(spec.grad_slots(), spec.weight_slots());
    return choice;
  }
  auto fits = [&](uint64_t bytes) {
    return limit.bytes == 0 || bytes <= limit.bytes;
  };
  if (fits(choice.resident_arena_bytes)) {
    choice.arena_bytes = choice.resident_arena_bytes;
    return choice;
  }
  const uint64_t most = MostStreamed(spec);
  // Gradients streamed, weights resident: each step's weights stay in the
  // arena (no SSD traffic for them), half the resident arena's buffers.
  for (uint64_t k = most; k >= 1; --k) {
    const uint64_t bytes = with_buffers(k, 0);
    if (fits(bytes)) {
      choice.arena_bytes = bytes;
      choice.grad_buffers = static_cast<uint32_t>(k);
      return choice;
    }
  }
  for (uint64_t k = most; k >= 1; --k) {
    const uint64_t bytes = with_buffers(k, k);
    if (fits(bytes)) {
      choice.arena_bytes = bytes;
      choice.grad_buffers = choice.weight_buffers = static_cast<uint32_t>(k);
      return choice;
    }
  }
  std::string streamed =
      most >= 1 ? absl::StrCat(", and at least ", MiB(with_buffers(1, 1)),
                               " streaming through one shared buffer of each")
                : " (a model of one layer, or with grad_slots 0, cannot "
                  "stream)";
  return absl::ResourceExhaustedError(absl::StrCat(
      "this model needs ", MiB(choice.resident_arena_bytes),
      " of arena with a gradient and a weight buffer per layer", streamed, "; ",
      limit.what, " is ", MiB(limit.bytes), ": ", limit.remedy,
      spec.activation_bytes() > 0
          ? absl::StrCat(", or a smaller activation area (",
                         MiB(RoundUp(spec.activation_bytes(), kMiB)), " of it)")
          : ""));
}

absl::StatusOr<v1::ArenaSizing> SizeJobArena(const v1::ModelSpec& model,
                                             uint32_t uid, uint64_t pool_bytes,
                                             uint64_t quota_bytes) {
  ArenaLimit limit{.bytes = pool_bytes,
                   .what = "the whole host pool",
                   .remedy =
                       "start lohand with a larger pool "
                       "(--host-pool-size, [pool] host_pool_size)"};
  if (quota_bytes != 0 && (pool_bytes == 0 || quota_bytes < pool_bytes)) {
    limit = ArenaLimit{
        .bytes = quota_bytes,
        .what = absl::StrCat("uid ", uid, "'s quota ([quotas] host_pool)"),
        .remedy = "ask for a larger [quotas] host_pool in lohand.toml"};
  }
  absl::StatusOr<ArenaChoice> choice = ChooseArena(model, limit);
  if (!choice.ok()) return choice.status();
  v1::ArenaSizing sizing;
  sizing.set_arena_bytes(choice->arena_bytes);
  sizing.set_stream_buffers(choice->grad_buffers);
  sizing.set_resident_arena_bytes(choice->resident_arena_bytes);
  return sizing;
}

}  // namespace lohan
