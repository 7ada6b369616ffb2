//! Reading Parquet files, the way Hugging Face datasets ship: the names of a
//! file's columns (from its footer), and its rows, one row group at a time,
//! each as the JSON object a `.jsonl` line with the same record would give,
//! so text and instruction data read Parquet through the paths they read
//! JSON records with.
//!
//! Rows are read with the `parquet` crate's record API, projected to the
//! columns asked for: a dataset's other columns (ids, URLs, scores) are never
//! decoded, and memory holds one row group's pages at most.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ::parquet::errors::ParquetError as ReadError;
use ::parquet::file::reader::{FileReader, SerializedFileReader};
use ::parquet::record::reader::RowIter;
use ::parquet::record::{Field, Row};
use ::parquet::schema::types::Type;
use serde_json::Value;

/// Why a Parquet file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ParquetError {
    #[error("`{}` cannot be read: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    // The parquet crate's error is part of the message rather than a
    // `source`, so that error-chain printers do not repeat it.
    #[error("`{}` is not a Parquet file that can be read: {}", path.display(), one_line(error))]
    NotParquet { path: PathBuf, error: ReadError },
    #[error("`{}` row group {group}: {}", path.display(), one_line(error))]
    Rows {
        path: PathBuf,
        group: usize,
        error: ReadError,
    },
    #[error("`{}` row {row}: bytes that are not UTF-8 text", path.display())]
    NotText { path: PathBuf, row: usize },
    #[error(
        "`{}` has no {wanted} (its columns: {})",
        path.display(),
        listed(columns)
    )]
    NoColumn {
        path: PathBuf,
        /// The column that would do, in words: "`text` column".
        wanted: String,
        columns: Vec<String>,
    },
}

/// `error` on one line (the crate's messages may wrap).
fn one_line(error: &ReadError) -> String {
    error
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `columns` as `` `a`, `b` ``, or "none".
fn listed(columns: &[String]) -> String {
    if columns.is_empty() {
        return "none".into();
    }
    columns
        .iter()
        .map(|c| format!("`{c}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn open(file: &Path) -> Result<SerializedFileReader<File>, ParquetError> {
    let handle = File::open(file).map_err(|error| ParquetError::Io {
        path: file.to_path_buf(),
        error,
    })?;
    SerializedFileReader::new(handle).map_err(|error| ParquetError::NotParquet {
        path: file.to_path_buf(),
        error,
    })
}

/// The top-level columns of the Parquet file `file`, from its footer.
pub fn columns(file: &Path) -> Result<Vec<String>, ParquetError> {
    let reader = open(file)?;
    let schema = reader.metadata().file_metadata().schema();
    Ok(schema
        .get_fields()
        .iter()
        .map(|f| f.name().to_string())
        .collect())
}

/// The error for `file` lacking the column `wanted` names (in words: "`text`
/// column"), listing the columns it has.
pub fn no_column(file: &Path, wanted: &str) -> ParquetError {
    match columns(file) {
        Ok(columns) => ParquetError::NoColumn {
            path: file.to_path_buf(),
            wanted: wanted.to_string(),
            columns,
        },
        Err(e) => e,
    }
}

/// Calls `each` with every row of the Parquet file `file`, in order: its
/// number (from 1) and the values of those of `columns` the file has, as a
/// JSON object. Reads one row group at a time and stops at the first error,
/// `each`'s included. A file with none of `columns` is an error naming
/// `wanted` (those columns, in words: "`text` column") and the columns it
/// has.
pub fn for_each_row<E: From<ParquetError>>(
    file: &Path,
    columns: &[&str],
    wanted: &str,
    mut each: impl FnMut(usize, Value) -> Result<(), E>,
) -> Result<(), E> {
    let reader = open(file)?;
    let schema = reader.metadata().file_metadata().schema();
    let kept: Vec<Arc<Type>> = schema
        .get_fields()
        .iter()
        .filter(|f| columns.contains(&f.name()))
        .cloned()
        .collect();
    if kept.is_empty() {
        return Err(no_column(file, wanted).into());
    }
    let projection = Type::group_type_builder(schema.name())
        .with_fields(kept)
        .build()
        .map_err(|error| ParquetError::NotParquet {
            path: file.to_path_buf(),
            error,
        })?;
    let rows_error = |group, error| ParquetError::Rows {
        path: file.to_path_buf(),
        group,
        error,
    };
    let mut number = 0;
    for group in 0..reader.num_row_groups() {
        let row_group = reader
            .get_row_group(group)
            .map_err(|e| rows_error(group, e))?;
        let rows = RowIter::from_row_group(Some(projection.clone()), &*row_group)
            .map_err(|e| rows_error(group, e))?;
        for row in rows {
            let row = row.map_err(|e| rows_error(group, e))?;
            number += 1;
            let value = row_json(&row).ok_or_else(|| ParquetError::NotText {
                path: file.to_path_buf(),
                row: number,
            })?;
            each(number, value)?;
        }
    }
    Ok(())
}

/// `row` as a JSON object; `None` where it holds bytes that are not UTF-8.
fn row_json(row: &Row) -> Option<Value> {
    let fields = row
        .get_column_iter()
        .map(|(k, f)| Some((k.clone(), json(f)?)));
    Some(Value::Object(fields.collect::<Option<_>>()?))
}

/// `field` as JSON, as the crate's `to_json_value` makes it but for bytes:
/// writers that leave a string column unannotated store text as bytes,
/// which are read as the text they are rather than as base64.
fn json(field: &Field) -> Option<Value> {
    Some(match field {
        Field::Bytes(bytes) => Value::String(std::str::from_utf8(bytes.data()).ok()?.to_owned()),
        Field::Group(row) => row_json(row)?,
        Field::ListInternal(list) => {
            Value::Array(list.elements().iter().map(json).collect::<Option<_>>()?)
        }
        other => other.to_json_value(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/parquet")
            .join(name)
    }

    /// Rows come projected, in order, over row groups, with nested lists of
    /// structs as JSON arrays of objects.
    #[test]
    fn rows_are_the_json_records_of_the_same_data() {
        let mut texts = Vec::new();
        for_each_row::<ParquetError>(
            &fixture("text.parquet"),
            &["text"],
            "`text` column",
            |n, v| {
                assert_eq!(v.as_object().map(|o| o.len()), Some(1), "only `text`");
                texts.push((n, v["text"].as_str().unwrap().to_string()));
                Ok(())
            },
        )
        .unwrap();
        let jsonl = std::fs::read_to_string(fixture("text.jsonl")).unwrap();
        let want: Vec<(usize, String)> = jsonl
            .lines()
            .enumerate()
            .map(|(i, l)| {
                let v: Value = serde_json::from_str(l).unwrap();
                (i + 1, v["text"].as_str().unwrap().to_string())
            })
            .collect();
        assert_eq!(texts, want);

        let mut chats = Vec::new();
        for_each_row::<ParquetError>(&fixture("chat.parquet"), &["messages"], "", |_, v| {
            chats.push(v);
            Ok(())
        })
        .unwrap();
        let jsonl = std::fs::read_to_string(fixture("chat.jsonl")).unwrap();
        let want: Vec<Value> = jsonl
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(chats, want);
    }

    /// Text stored as bytes without the string annotation reads as text;
    /// bytes that are not UTF-8 are an error naming the row.
    #[test]
    fn unannotated_bytes_are_text_when_they_are_utf8() {
        let texts = |name: &str| {
            let mut texts = Vec::new();
            for_each_row::<ParquetError>(&fixture(name), &["text"], "", |_, v| {
                texts.push(v["text"].as_str().unwrap().to_string());
                Ok(())
            })
            .map(|()| texts)
        };
        assert_eq!(
            texts("binary_text.parquet").unwrap(),
            texts("text.parquet").unwrap()
        );
        let err = texts("not_utf8.parquet").unwrap_err();
        assert!(matches!(err, ParquetError::NotText { row: 2, .. }), "{err}");
    }

    #[test]
    fn a_file_without_the_columns_says_which_it_has() {
        let file = fixture("no_usable_column.parquet");
        let err = for_each_row::<ParquetError>(&file, &["text"], "`text` column", |_, _| Ok(()))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "`{}` has no `text` column (its columns: `id`, `score`)",
                file.display()
            )
        );
    }

    #[test]
    fn a_file_that_is_not_parquet_is_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.parquet");
        std::fs::write(&file, "text, not Parquet\n").unwrap();
        let err = columns(&file).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "`{}` is not a Parquet file that can be read: ",
                file.display()
            )),
            "{message}"
        );
        assert!(!message.contains('\n'), "{message}");
    }
}
