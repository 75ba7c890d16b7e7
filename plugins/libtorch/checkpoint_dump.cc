// checkpoint_dump DIR OUT: every parameter of the checkpoint in DIR (one
// process's or a sharded one), its weights and each Adam moment it holds,
// as raw little-endian fp32 in OUT/<part>/<name>.f32, through the C++
// CheckpointReader (for tests/python/test_data_parallel.py). Exit status 1
// with the error on stderr.
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "plugins/libtorch/checkpoint.h"

namespace fs = std::filesystem;
using lohan::torch_plugin::CheckpointReader;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: checkpoint_dump DIR OUT\n";
    return 2;
  }
  try {
    const CheckpointReader reader(argv[1]);
    std::vector<std::string> parts = {"weights"};
    parts.insert(parts.end(), reader.moments().begin(), reader.moments().end());
    for (const std::string& part : parts) {
      const fs::path directory = fs::path(argv[2]) / part;
      fs::create_directories(directory);
      for (const auto& [name, shape] : reader.Parameters()) {
        size_t count = 1;
        for (int64_t size : shape) count *= static_cast<size_t>(size);
        std::vector<float> values(count);
        reader.Read(name, part, shape, values.data());
        const fs::path path = directory / (name + ".f32");
        std::ofstream out(path, std::ios::binary);
        out.write(reinterpret_cast<const char*>(values.data()),
                  static_cast<std::streamsize>(count * sizeof(float)));
        out.close();
        if (!out) throw std::runtime_error("cannot write " + path.string());
      }
    }
    std::cout << reader.Parameters().size() << " parameters of "
              << reader.world_size() << " shard(s), " << parts.size()
              << " part(s)\n";
  } catch (const std::exception& error) {
    std::cerr << "checkpoint_dump: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
