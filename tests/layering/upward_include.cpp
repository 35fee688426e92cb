// Compiled against the model layer's include root by the layering tests: a
// layer that reaches up to the trainer must not build.
#include "anvil/train/trainer.hpp"
