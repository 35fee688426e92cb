// Typed errors. Every error anvil throws names the input at fault and the value
// it expected; the CLI prints the message as one line and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

namespace anvil {

// Bad input from the user: a flag, a config field, a file. The CLI exits 2.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The system failed underneath us (a library missing, an I/O error). Exit 1.
class SystemError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace anvil
