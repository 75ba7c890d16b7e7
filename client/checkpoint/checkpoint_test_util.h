#ifndef LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
#define LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/checkpoint.pb.h"

namespace lohan::checkpoint {

// The tests' model: layer 0 holds a [2, 3] and b [3] at offset 6 (9
// elements), layer 1 holds c [4]; `parts` to save, job "test".
inline v1::CheckpointContents TwoLayers(const std::vector<std::string>& parts,
                                        uint64_t iteration) {
  v1::CheckpointContents contents;
  contents.set_job_name("test");
  contents.set_iteration(iteration);
  for (const std::string& part : parts) contents.add_parts(part);
  v1::CheckpointLayer* first = contents.add_layers();
  first->set_elements(9);
  v1::CheckpointTensor* a = first->add_tensors();
  a->set_name("a");
  a->add_shape(2);
  a->add_shape(3);
  v1::CheckpointTensor* b = first->add_tensors();
  b->set_name("b");
  b->add_shape(3);
  b->set_offset(6);
  v1::CheckpointLayer* second = contents.add_layers();
  second->set_elements(4);
  v1::CheckpointTensor* c = second->add_tensors();
  c->set_name("c");
  c->add_shape(4);
  return contents;
}

}  // namespace lohan::checkpoint

#endif  // LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
