#include "client/checkpoint/sharded_tensors.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace lohan::checkpoint {
namespace fs = std::filesystem;
namespace {

absl::StatusOr<const JsonValue*> Member(const JsonValue& object,
                                        const std::string& key,
                                        const std::string& where) {
  const JsonValue* found = object.Find(key);
  if (found == nullptr) {
    return absl::DataLossError(absl::StrCat(where, " lacks \"", key, "\""));
  }
  return found;
}

absl::StatusOr<uint64_t> Count(const JsonValue& object, const std::string& key,
                               const std::string& where) {
  absl::StatusOr<const JsonValue*> member = Member(object, key, where);
  if (!member.ok()) return member.status();
  return (*member)->AsUint64(where + " " + key);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardedTensors>> ShardedTensors::Open(
    const fs::path& directory, const JsonValue& plan,
    const JsonValue* manifest) {
  std::unique_ptr<ShardedTensors> tensors(
      new ShardedTensors(directory.string()));
  const std::string where =
      "checkpoint " + directory.string() + ": lohan.json's sharding";
  absl::StatusOr<uint64_t> world = Count(plan, "world_size", where);
  if (!world.ok()) return world.status();
  absl::StatusOr<const JsonValue*> files = Member(plan, "files", where);
  if (!files.ok()) return files.status();
  if (*world == 0 || (*files)->items().size() != *world) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", directory.string(), " is inconsistent: ", where,
        " names ", (*files)->items().size(), " shard files for world size ",
        *world));
  }
  for (const JsonValue& file : (*files)->items()) {
    if (manifest == nullptr || manifest->Find(file.text()) == nullptr) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", directory.string(),
                       " is inconsistent: the shard file ", file.text(),
                       " is not in its manifest"));
    }
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> opened =
        SafetensorsFile::Open((directory / file.text()).string());
    if (!opened.ok()) return opened.status();
    tensors->files_.push_back(std::move(*opened));
  }
  absl::StatusOr<const JsonValue*> layers = Member(plan, "layers", where);
  if (!layers.ok()) return layers.status();
  for (size_t i = 0; i < (*layers)->items().size(); ++i) {
    if (absl::Status added =
            tensors->AddLayer(i, (*layers)->items()[i], *world, where);
        !added.ok()) {
      return added;
    }
  }
  return tensors;
}

absl::Status ShardedTensors::AddLayer(size_t index, const JsonValue& layer,
                                      uint64_t world,
                                      const std::string& where) {
  const std::string at = absl::StrCat(where, " layer ", index);
  absl::StatusOr<uint64_t> numel = Count(layer, "numel", at);
  if (!numel.ok()) return numel.status();
  absl::StatusOr<uint64_t> shard = Count(layer, "shard", at);
  if (!shard.ok()) return shard.status();
  if (*shard * world < *numel) {
    return absl::DataLossError(absl::StrCat(at, ": ", world, " shards of ",
                                            *shard, " elements cannot hold ",
                                            *numel));
  }
  shard_.push_back(*shard);
  absl::StatusOr<const JsonValue*> names = Member(layer, "names", at);
  absl::StatusOr<const JsonValue*> shapes = Member(layer, "shapes", at);
  absl::StatusOr<const JsonValue*> offsets = Member(layer, "offsets", at);
  for (const auto* member : {&names, &shapes, &offsets}) {
    if (!member->ok()) return member->status();
  }
  const size_t count = (*names)->items().size();
  if ((*shapes)->items().size() != count ||
      (*offsets)->items().size() != count) {
    return absl::DataLossError(at +
                               ": names, shapes and offsets differ in length");
  }
  for (size_t p = 0; p < count; ++p) {
    Place place{index, 0, {}};
    absl::StatusOr<uint64_t> offset = (*offsets)->items()[p].AsUint64(at);
    if (!offset.ok()) return offset.status();
    place.offset = *offset;
    for (const JsonValue& d : (*shapes)->items()[p].items()) {
      absl::StatusOr<uint64_t> size = d.AsUint64(at);
      if (!size.ok()) return size.status();
      place.shape.push_back(static_cast<int64_t>(*size));
    }
    const std::string& name = (*names)->items()[p].text();
    if (place.offset + Elements(place.shape) > *numel) {
      return absl::DataLossError(
          absl::StrCat(at, ": parameter ", name, " lies past the layer's end"));
    }
    names_.push_back(name);
    where_[name] = std::move(place);
  }
  return absl::OkStatus();
}

const std::vector<int64_t>* ShardedTensors::ShapeOf(
    const std::string& name) const {
  const auto found = where_.find(name);
  return found == where_.end() ? nullptr : &found->second.shape;
}

std::string ShardedTensors::DtypeOf(const std::string& name,
                                    const std::string& part) const {
  const auto found = where_.find(name);
  if (found == where_.end()) return "";
  const SafetensorsFile::Entry* entry =
      files_[0]->Find(absl::StrCat("layer.", found->second.layer, "/", part));
  return entry == nullptr ? "" : entry->dtype;
}

absl::Status ShardedTensors::ReadRange(const std::string& name,
                                       const std::string& part, uint64_t first,
                                       uint64_t count, float* out) const {
  const auto found = where_.find(name);
  if (found == where_.end()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", path_, " has no parameter ", name));
  }
  const Place& place = found->second;
  const uint64_t elements = Elements(place.shape);
  if (first > elements || count > elements - first) {
    return absl::OutOfRangeError(
        absl::StrCat("checkpoint ", path_, ": elements ", first, " + ", count,
                     " of parameter ", name, ", which has ", elements));
  }
  const uint64_t shard = shard_[place.layer];
  const std::string key = absl::StrCat("layer.", place.layer, "/", part);
  uint64_t begin = place.offset + first;
  const uint64_t end = begin + count;
  while (begin < end) {
    const uint64_t rank = begin / shard;
    const uint64_t stop = std::min(end, (rank + 1) * shard);
    const SafetensorsFile& file = *files_[rank];
    const SafetensorsFile::Entry* entry = file.Find(key);
    if (entry == nullptr) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", path_, ": ",
                                              file.path(), " has no ", key,
                                              " (for parameter ", name, ")"));
    }
    if (entry->shape != std::vector<int64_t>{static_cast<int64_t>(shard)}) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", path_, ": ", key, " in ", file.path(),
                       " is not of the ", shard,
                       " elements lohan.json gives the layer's shards"));
    }
    if (absl::Status read =
            file.ReadRange(*entry, begin - rank * shard, stop - begin, out);
        !read.ok()) {
      return read;
    }
    out += stop - begin;
    begin = stop;
  }
  return absl::OkStatus();
}

}  // namespace lohan::checkpoint
