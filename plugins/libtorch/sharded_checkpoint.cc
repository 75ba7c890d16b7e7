#include "plugins/libtorch/sharded_checkpoint.h"

#include <stdexcept>
#include <utility>

namespace lohan::torch_plugin {
namespace fs = std::filesystem;
namespace {

std::vector<int64_t> Shape(const JsonValue& value, const std::string& what) {
  std::vector<int64_t> shape;
  for (const JsonValue& d : value.items()) {
    shape.push_back(static_cast<int64_t>(d.AsUint64(what)));
  }
  return shape;
}

uint64_t Elements(const std::vector<int64_t>& shape) {
  uint64_t count = 1;
  for (int64_t size : shape) count *= static_cast<uint64_t>(size);
  return count;
}

const JsonValue& Member(const JsonValue& object, const std::string& key,
                        const std::string& where) {
  const JsonValue* found = object.Find(key);
  if (found == nullptr) {
    throw std::invalid_argument(where + " lacks \"" + key + "\"");
  }
  return *found;
}

}  // namespace

ShardedTensors::ShardedTensors(const fs::path& directory, const JsonValue& plan,
                               const JsonValue* manifest)
    : path_(directory.string()) {
  const std::string where = "checkpoint " + path_ + ": lohan.json's sharding";
  const uint64_t world = Member(plan, "world_size", where).AsUint64(where);
  const JsonValue& files = Member(plan, "files", where);
  if (world == 0 || files.items().size() != world) {
    throw std::invalid_argument(
        where + " names " + std::to_string(files.items().size()) +
        " shard files for world size " + std::to_string(world));
  }
  for (const JsonValue& file : files.items()) {
    if (manifest == nullptr || manifest->Find(file.text()) == nullptr) {
      throw std::invalid_argument("checkpoint " + path_ +
                                  " is inconsistent: the shard file " +
                                  file.text() + " is not in its manifest");
    }
    files_.push_back(
        std::make_unique<SafetensorsFile>((directory / file.text()).string()));
  }
  const JsonValue& layers = Member(plan, "layers", where);
  for (size_t i = 0; i < layers.items().size(); ++i) {
    const JsonValue& layer = layers.items()[i];
    const std::string at = where + " layer " + std::to_string(i);
    const uint64_t numel = Member(layer, "numel", at).AsUint64(at);
    const uint64_t shard = Member(layer, "shard", at).AsUint64(at);
    if (shard * world < numel) {
      throw std::invalid_argument(at + ": " + std::to_string(world) +
                                  " shards of " + std::to_string(shard) +
                                  " elements cannot hold " +
                                  std::to_string(numel));
    }
    shard_.push_back(shard);
    const JsonValue& names = Member(layer, "names", at);
    const JsonValue& shapes = Member(layer, "shapes", at);
    const JsonValue& offsets = Member(layer, "offsets", at);
    if (shapes.items().size() != names.items().size() ||
        offsets.items().size() != names.items().size()) {
      throw std::invalid_argument(at +
                                  ": names, shapes and offsets differ "
                                  "in length");
    }
    for (size_t p = 0; p < names.items().size(); ++p) {
      Place place{i, offsets.items()[p].AsUint64(at),
                  Shape(shapes.items()[p], at)};
      if (place.offset + Elements(place.shape) > numel) {
        throw std::invalid_argument(at + ": parameter " +
                                    names.items()[p].text() +
                                    " lies past the layer's end");
      }
      names_.push_back(names.items()[p].text());
      where_[names_.back()] = std::move(place);
    }
  }
}

const std::vector<int64_t>* ShardedTensors::ShapeOf(
    const std::string& name) const {
  const auto found = where_.find(name);
  return found == where_.end() ? nullptr : &found->second.shape;
}

void ShardedTensors::Read(const std::string& name, const std::string& part,
                          float* out) const {
  const Place& place = where_.at(name);
  const uint64_t shard = shard_[place.layer];
  const std::string key = "layer." + std::to_string(place.layer) + "/" + part;
  uint64_t begin = place.offset;
  const uint64_t end = begin + Elements(place.shape);
  while (begin < end) {
    const uint64_t rank = begin / shard;
    const uint64_t stop = std::min(end, (rank + 1) * shard);
    const SafetensorsFile& file = *files_[rank];
    const SafetensorsFile::Entry* entry = file.Find(key);
    if (entry == nullptr) {
      throw std::invalid_argument("checkpoint " + path_ + ": " + file.path() +
                                  " has no " + key + " (for parameter " + name +
                                  ")");
    }
    if (entry->shape != std::vector<int64_t>{static_cast<int64_t>(shard)}) {
      throw std::invalid_argument("checkpoint " + path_ + ": " + key + " in " +
                                  file.path() + " is not of the " +
                                  std::to_string(shard) +
                                  " elements lohan.json gives the layer's "
                                  "shards");
    }
    file.ReadRange(*entry, begin - rank * shard, stop - begin, out);
    out += stop - begin;
    begin = stop;
  }
}

}  // namespace lohan::torch_plugin
