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
// `os_error` keeps the errno of a failed call (ENOSPC: a full disk), 0 when
// the failure was not one.
class SystemError : public std::runtime_error {
 public:
  explicit SystemError(const std::string& what, int os_error = 0)
      : std::runtime_error(what), os_error_(os_error) {}
  int os_error() const { return os_error_; }

 private:
  int os_error_ = 0;
};

}  // namespace anvil
