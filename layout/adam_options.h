#ifndef LOHAN_LAYOUT_ADAM_OPTIONS_H_
#define LOHAN_LAYOUT_ADAM_OPTIONS_H_

// Adam's scalar options, part of a model's description (its parameter
// groups carry them); daemon/optim's AdamUpdater applies them.

namespace lohan {

// Per step (torch.optim.AdamW / Adam), with the scalars computed in double
// once per tensor and the elementwise work in float:
//   t = step + 1
//   AdamW: w *= 1 - lr*wd          Adam: g += wd*w
//   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//   amsgrad: vmax = max(vmax, v) and vmax replaces v below
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps
//   w -= (lr / (1 - b1^t)) * m / denom
// Without bias correction both 1 - b^t factors are 1.
struct AdamOptions {
  double lr = 1e-3;                    // >= 0
  double beta1 = 0.9;                  // [0, 1)
  double beta2 = 0.999;                // [0, 1)
  double eps = 1e-8;                   // >= 0
  double weight_decay = 0.0;           // >= 0
  bool decoupled_weight_decay = true;  // true: AdamW; false: Adam (L2)
  bool amsgrad = false;
  bool bias_correction = true;
};

}  // namespace lohan

#endif  // LOHAN_LAYOUT_ADAM_OPTIONS_H_
