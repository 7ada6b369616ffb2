//! Reading a text corpus from disk: which files a path names (a file, or
//! every `.txt`, `.jsonl` and `.parquet` file under a folder), and their
//! documents (the text, or the `text` field of each JSON line or Parquet
//! row), joined by a blank line.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::DataError;
use super::parquet;

/// Separator placed between documents (files, JSONL records) in a corpus.
pub(crate) const DOC_SEPARATOR: &str = "\n\n";

/// Reads a training corpus from `path`.
///
/// * A `.jsonl` file is read as one JSON object per line; the string field
///   `text` of each object is a document. Blank lines are skipped.
/// * A Parquet file (`.parquet`, or a file starting with its magic) is read
///   row by row; the string column `text` of each row is a document.
/// * Any other file is read as UTF-8 text.
/// * A directory contributes every `.txt`, `.jsonl` and `.parquet` file inside it,
///   recursively, in sorted path order so the corpus is the same on every run.
///
/// Documents are joined with a blank line. An empty result is an error, since
/// training on nothing would only fail later with a less helpful message.
pub fn read_corpus(path: &Path) -> Result<String, DataError> {
    let files = corpus_files(path)?;
    let mut docs = Vec::with_capacity(files.len());
    for file in &files {
        let doc = read_corpus_file(file)?;
        // Empty files inside a directory are tolerated; they just must not
        // add stray separators.
        if !doc.is_empty() {
            docs.push(doc);
        }
    }
    let corpus = docs.join(DOC_SEPARATOR);
    if corpus.is_empty() {
        return Err(DataError::Empty(path.to_path_buf()));
    }
    Ok(corpus)
}

/// The files of the corpus at `path`: itself, or for a directory every
/// `.txt`, `.jsonl` and `.parquet` file inside it, recursively, in sorted
/// path order.
pub fn corpus_files(path: &Path) -> Result<Vec<PathBuf>, DataError> {
    let meta = fs::metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => DataError::NotFound(path.to_path_buf()),
        _ => DataError::io(path, e),
    })?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !meta.is_dir() {
        return Err(DataError::NotAFile(path.to_path_buf()));
    }
    let mut files = Vec::new();
    collect_files(path, &["txt", "jsonl", "parquet"], &mut files)?;
    if files.is_empty() {
        return Err(DataError::NoCorpusFiles(path.to_path_buf()));
    }
    files.sort();
    Ok(files)
}

/// Whether `path` is a Parquet file: its extension, or the `PAR1` magic its
/// files start with (unless it is named as text or JSON, which may start
/// with those letters).
pub(crate) fn is_parquet(path: &Path) -> bool {
    if has_extension(path, "parquet") {
        return true;
    }
    if ["txt", "json", "jsonl"]
        .iter()
        .any(|ext| has_extension(path, ext))
    {
        return false;
    }
    let mut magic = [0u8; 4];
    fs::File::open(path)
        .and_then(|mut f| io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| &magic == b"PAR1")
}

pub(crate) fn has_extension(path: &Path, ext: &str) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case(ext))
}

/// Recursively gathers the files under `dir` with one of `extensions`, in
/// the order the folder lists them.
pub(crate) fn collect_files(
    dir: &Path,
    extensions: &[&str],
    out: &mut Vec<PathBuf>,
) -> Result<(), DataError> {
    let entries = fs::read_dir(dir).map_err(|e| DataError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| DataError::io(dir, e))?;
        let path = entry.path();
        let file_type = entry.file_type().map_err(|e| DataError::io(&path, e))?;
        if file_type.is_dir() {
            // Only real directories are descended into (`file_type` does not
            // follow symlinks), which rules out symlink cycles.
            collect_files(&path, extensions, out)?;
            continue;
        }
        if !extensions.iter().any(|ext| has_extension(&path, ext)) {
            continue;
        }
        // A symlink to a regular file is accepted; a dangling one is reported
        // rather than silently dropped, since the user named it as data.
        let is_file = if file_type.is_symlink() {
            fs::metadata(&path)
                .map_err(|e| DataError::io(&path, e))?
                .is_file()
        } else {
            file_type.is_file()
        };
        if is_file {
            out.push(path);
        }
    }
    Ok(())
}

/// Reads one file as text, JSONL or Parquet depending on its extension. May
/// return an empty string; callers decide whether that is an error.
pub(crate) fn read_corpus_file(path: &Path) -> Result<String, DataError> {
    if is_parquet(path) {
        let mut docs = Vec::new();
        parquet_documents(path, |doc| {
            docs.push(doc.to_owned());
            Ok(())
        })?;
        return Ok(docs.join(DOC_SEPARATOR));
    }
    let bytes = fs::read(path).map_err(|e| DataError::io(path, e))?;
    let mut text = String::from_utf8(bytes).map_err(|e| DataError::NotUtf8 {
        path: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to(),
    })?;
    // Editors on Windows may start a UTF-8 file with a byte-order mark: it is
    // not part of the text (and not valid JSON).
    if text.starts_with('\u{feff}') {
        text.drain(..'\u{feff}'.len_utf8());
    }
    if has_extension(path, "jsonl") {
        parse_jsonl(path, &text)
    } else {
        Ok(text)
    }
}

/// Calls `each` with the documents of the Parquet file `path`: the `text`
/// column, row by row, one row group at a time, empty ones skipped (as
/// [`parse_jsonl`] skips them).
pub(crate) fn parquet_documents(
    path: &Path,
    mut each: impl FnMut(&str) -> Result<(), DataError>,
) -> Result<(), DataError> {
    parquet::for_each_row(path, &["text"], "`text` column", |row, record| {
        let doc =
            record
                .get("text")
                .and_then(Value::as_str)
                .ok_or_else(|| DataError::ParquetText {
                    path: path.to_path_buf(),
                    row,
                })?;
        if doc.is_empty() {
            return Ok(());
        }
        each(doc)
    })
}

fn parse_jsonl(path: &Path, text: &str) -> Result<String, DataError> {
    let mut docs = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line_no = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|error| DataError::InvalidJson {
                path: path.to_path_buf(),
                line: line_no,
                error,
            })?;
        let doc = value
            .get("text")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| DataError::MissingText {
                path: path.to_path_buf(),
                line: line_no,
            })?;
        if !doc.is_empty() {
            docs.push(doc.to_owned());
        }
    }
    Ok(docs.join(DOC_SEPARATOR))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use tempfile::tempdir;

    fn write(path: &Path, contents: &[u8]) {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create test dir");
        }
        fs::write(path, contents).expect("write test file");
    }

    #[test]
    fn missing_path_is_not_found() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("nope.txt");
        let err = read_corpus(&path).unwrap_err();
        assert!(matches!(err, DataError::NotFound(ref p) if p == &path));
        assert_eq!(
            err.to_string(),
            format!("`{}` does not exist", path.display())
        );
    }

    #[test]
    fn empty_file_is_rejected() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("empty.txt");
        write(&path, b"");
        let err = read_corpus(&path).unwrap_err();
        assert!(matches!(err, DataError::Empty(_)), "{err}");
        assert!(err.to_string().ends_with("is empty"));
    }

    #[test]
    fn directory_without_corpus_files_is_rejected() {
        let dir = tempdir().expect("tempdir");
        write(&dir.path().join("notes.md"), b"not corpus");
        let err = read_corpus(dir.path()).unwrap_err();
        assert!(matches!(err, DataError::NoCorpusFiles(_)), "{err}");
        assert!(err
            .to_string()
            .contains("contains no .txt, .jsonl or .parquet files"));
    }

    #[test]
    fn directory_with_only_empty_files_is_empty() {
        let dir = tempdir().expect("tempdir");
        write(&dir.path().join("a.txt"), b"");
        write(&dir.path().join("b.jsonl"), b"\n\n");
        let err = read_corpus(dir.path()).unwrap_err();
        assert!(matches!(err, DataError::Empty(_)), "{err}");
    }

    #[test]
    fn non_utf8_file_reports_offset() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("bad.txt");
        write(&path, b"abc\xffdef");
        let err = read_corpus(&path).unwrap_err();
        assert!(
            matches!(err, DataError::NotUtf8 { offset: 3, .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "`{}` is not UTF-8 text (invalid byte at offset 3)",
                path.display()
            )
        );
    }

    #[test]
    fn jsonl_without_text_field_reports_line() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("d.jsonl");
        write(&path, b"{\"text\": \"ok\"}\n\n{\"body\": \"no\"}\n");
        let err = read_corpus(&path).unwrap_err();
        assert!(
            matches!(err, DataError::MissingText { line: 3, .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "`{}` line 3: JSON object has no string field `text`",
                path.display()
            )
        );

        // A non-string `text` is the same error.
        write(&path, b"{\"text\": 5}\n");
        let err = read_corpus(&path).unwrap_err();
        assert!(
            matches!(err, DataError::MissingText { line: 1, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn invalid_json_line_reports_line() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("d.jsonl");
        write(&path, b"{\"text\": \"ok\"}\n{\"text\": \n");
        let err = read_corpus(&path).unwrap_err();
        assert!(
            matches!(err, DataError::InvalidJson { line: 2, .. }),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("`{}` line 2: invalid JSON: ", path.display())),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn jsonl_file_joins_documents_and_skips_blank_lines() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("d.jsonl");
        write(
            &path,
            b"{\"text\": \"first\", \"id\": 1}\n   \n{\"text\": \"second\\nline\"}\r\n",
        );
        assert_eq!(read_corpus(&path).expect("read"), "first\n\nsecond\nline");
    }

    #[test]
    fn other_extensions_are_read_as_text() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("input.json");
        write(&path, b"{\"text\": \"raw\"}");
        assert_eq!(read_corpus(&path).expect("read"), "{\"text\": \"raw\"}");
    }

    #[test]
    fn directory_mixes_txt_and_jsonl_in_sorted_order() {
        let dir = tempdir().expect("tempdir");
        write(
            &dir.path().join("b.jsonl"),
            b"{\"text\": \"B1\"}\n{\"text\": \"B2\"}\n",
        );
        write(&dir.path().join("a.txt"), b"A");
        write(&dir.path().join("c.txt"), b"C");
        write(&dir.path().join("sub/d.txt"), b"D");
        write(&dir.path().join("ignored.md"), b"nope");
        write(&dir.path().join("empty.txt"), b"");
        let corpus = read_corpus(dir.path()).expect("read");
        assert_eq!(corpus, "A\n\nB1\n\nB2\n\nC\n\nD");
        assert_eq!(read_corpus(dir.path()).expect("read again"), corpus);
    }

    #[test]
    fn errors_inside_directory_name_the_file() {
        let dir = tempdir().expect("tempdir");
        write(&dir.path().join("a.txt"), b"fine");
        let bad = dir.path().join("b.txt");
        write(&bad, b"\xc3");
        let err = read_corpus(dir.path()).unwrap_err();
        assert!(matches!(err, DataError::NotUtf8 { ref path, offset: 0 } if path == &bad));
    }
}
