// A user's own data set, read from JSONL or CSV files (docs/data.md has the forms and examples).
//
//   JSONL  one object a line: {"text": ..., "label": ...} for classification (the model sees
//          "<text>\nlabel:" and predicts the label's name), {"prompt": ..., "completion": ...} for
//          generation. Blank lines are skipped; other keys are ignored.
//   CSV    RFC 4180 (commas, double quotes, "" for a quote inside a quoted field, fields may span
//          lines), UTF-8, a header row naming the columns text,label or prompt,completion (in any
//          order; other columns are ignored).
//
// The format follows the file name's extension (.jsonl or .csv). Each error is an amaq::Error whose
// message starts with the file's path (and the line, for a bad record) and says what to change:
// kNotFound for a missing file, kInvalidArgument for anything else, an empty file or a file of only
// a header included. One data set is either classification or generation, in all its files.
#pragma once

#include <string>

#include "common/text/datasets.h"

namespace amaq {

// Both files are required (the client reports its metric on the validation examples). The labels
// are numbered in order of first appearance in the training file, then validation.
Dataset LoadUserData(const std::string& train_path, const std::string& validation_path);

}  // namespace amaq
