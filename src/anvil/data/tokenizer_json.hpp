// anvil's tokenizers as Hugging Face's tokenizers library writes them
// (tokenizer.json), for the Hugging Face export: the byte tokenizer and
// SentencePiece BPE models, each the same ids in transformers. Also the
// reader of the one SentencePiece protobuf field that needs (the model
// type), which libsentencepiece's public API does not expose.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace anvil::data {

// GPT-2's byte-to-character map and a BPE model without merges: byte b is
// token b, exactly anvil's byte tokenizer.
nlohmann::json bytes_tokenizer_json();

// The SentencePiece model at `model_path` (one anvil trained: identity
// normalisation, no dummy prefix, byte fallback, "<nl>" for the newline)
// as a tokenizers-library BPE with the same ids; null JSON when the file is
// not a SentencePiece BPE model.
nlohmann::json sentencepiece_tokenizer_json(const std::string& model_path);

// The model type a SentencePiece model was trained as, read from its
// serialized ModelProto `proto` (ModelProto.trainer_spec = 2,
// TrainerSpec.model_type = 3): 1 unigram, 2 bpe; 0 when absent or
// unreadable.
int sentencepiece_model_type(const std::string& proto);

// What in the serialized ModelProto `proto` SentencePiece's loader cannot
// take, checked before it builds its trie (which throws from deep inside on
// these): a piece (ModelProto.pieces = 1, SentencePiece.piece = 1) that is
// empty or contains a NUL byte, named by its index; empty when none.
std::string sentencepiece_piece_problem(const std::string& proto);

}  // namespace anvil::data
