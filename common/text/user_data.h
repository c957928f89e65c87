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
// message starts with the file's path (and the line, for a bad record or header) and says what to
// change; its code is kInvalidArgument (amaq-client exits 2, as for other bad settings), a missing
// file, bytes that are not UTF-8, an empty file or a file of only a header included. One data set
// is either classification or generation, in all its files.
#pragma once

#include <string>

#include "common/text/datasets.h"

namespace amaq {

// Both files are required (the client reports its metric on the validation examples): throws
// amaq::Error (kInvalidArgument) naming the setting when a path is empty. LoadUserData checks it
// first; --check_config checks it alone.
void RequireUserDataFiles(const std::string& train_path, const std::string& validation_path);
// The labels are numbered in order of first appearance in the training file, then validation.
Dataset LoadUserData(const std::string& train_path, const std::string& validation_path);

}  // namespace amaq
