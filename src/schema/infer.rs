//! JSON schema inference, per record.
//!
//! Each record is scanned once, without building a value tree, into its *shape*: the type of
//! every field that carries a value. Records of one shape share an Arrow schema (kept in a
//! cache keyed by the shape's key, which [`super::shape_key`] reads off most records without
//! building their shape), so a poll is decoded as a few columnar batches, one per shape, by
//! arrow-json.
//!
//! ```text
//! integer -> Int64        number with a fraction or exponent -> Float64
//! string  -> Utf8         (or Timestamp, with 'json.timestamp-inference' = 'true')
//! boolean -> Boolean      object -> Struct          array -> List of the element type
//! null, [] and {}         no field: the shape lacks it, so no column is made for it
//! ```
//!
//! Elements of an array merge into one type: integers and doubles give doubles, objects
//! merge their fields; any other mix makes the record unreadable (it is dead-lettered).

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::Arc;

use super::types::INFERRED;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, ListArray, RecordBatch, RecordBatchOptions, StringArray, StructArray,
    new_null_array,
};
use datafusion::arrow::compute::{can_cast_types, cast};
use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// The type a JSON value gives its column.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    Long,
    Double,
    String,
    Boolean,
    /// A string that reads as a timestamp; `true` when it carries a UTC offset.
    Timestamp(bool),
    Struct(Vec<(String, Shape)>),
    List(Box<Shape>),
}

impl Shape {
    /// The Arrow type of a column of this shape.
    pub fn data_type(&self) -> DataType {
        match self {
            Shape::Long => DataType::Int64,
            Shape::Double => DataType::Float64,
            Shape::String => DataType::Utf8,
            Shape::Boolean => DataType::Boolean,
            Shape::Timestamp(tz) => {
                DataType::Timestamp(TimeUnit::Microsecond, tz.then(|| "+00:00".into()))
            }
            Shape::Struct(fields) => DataType::Struct(struct_fields(fields)),
            Shape::List(e) => DataType::List(Arc::new(Field::new("item", e.data_type(), true))),
        }
    }

    /// The shape values of `self` and `other` both fit, if there is one. Integers and
    /// fractions merge to double because JSON has one kind of number (an array of both is a
    /// list of numbers); that is not a column promotion, which long -> double is not
    /// (`schema::promote`).
    fn merge(self, other: Shape) -> Result<Shape, String> {
        Ok(match (self, other) {
            (a, b) if a == b => a,
            (Shape::Long, Shape::Double) | (Shape::Double, Shape::Long) => Shape::Double,
            (Shape::Timestamp(_), Shape::Timestamp(_)) => Shape::Timestamp(true),
            (Shape::Timestamp(_), Shape::String) | (Shape::String, Shape::Timestamp(_)) => {
                Shape::String
            }
            (Shape::Struct(mut a), Shape::Struct(b)) => {
                // Looked up, not scanned for, when the structs are wide (see `visit_map`).
                let mut places: Option<HashMap<String, usize>> =
                    (a.len() > SCANNED_KEYS).then(|| {
                        a.iter()
                            .enumerate()
                            .map(|(i, (n, _))| (n.clone(), i))
                            .collect()
                    });
                for (name, shape) in b {
                    let at = match &places {
                        Some(p) => p.get(&name).copied(),
                        None => a.iter().position(|(n, _)| *n == name),
                    };
                    match at {
                        Some(i) => a[i].1 = a[i].1.clone().merge(shape)?,
                        None => {
                            if let Some(p) = &mut places {
                                p.insert(name.clone(), a.len());
                            }
                            a.push((name, shape));
                        }
                    }
                }
                Shape::Struct(a)
            }
            (Shape::List(a), Shape::List(b)) => Shape::List(Box::new(a.merge(*b)?)),
            (a, b) => return Err(format!("an array mixes {a} and {b} values")),
        })
    }
}

impl fmt::Display for Shape {
    /// The shape's text: also the key records are grouped by.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Long => f.write_str("long"),
            Shape::Double => f.write_str("double"),
            Shape::String => f.write_str("string"),
            Shape::Boolean => f.write_str("boolean"),
            Shape::Timestamp(false) => f.write_str("timestamp"),
            Shape::Timestamp(true) => f.write_str("timestamptz"),
            Shape::Struct(fields) => {
                f.write_char('{')?;
                for (i, (name, shape)) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_char(',')?;
                    }
                    // Debug quoting keeps names with ':' or ',' unambiguous.
                    write!(f, "{name:?}:{shape}")?;
                }
                f.write_char('}')
            }
            Shape::List(e) => write!(f, "[{e}]"),
        }
    }
}

/// Keys of an object found by scanning; beyond this many, by a lookup.
const SCANNED_KEYS: usize = 16;

fn struct_fields(fields: &[(String, Shape)]) -> Fields {
    fields
        .iter()
        .map(|(name, shape)| Field::new(name, shape.data_type(), true))
        .collect()
}

/// The shape of one record, which must be one JSON object. An object with no typed
/// values has the empty shape.
pub fn record_shape(record: &[u8], timestamps: bool) -> Result<Vec<(String, Shape)>, String> {
    if record.trim_ascii().is_empty() {
        return Err("empty record".to_string());
    }
    let mut de = serde_json::Deserializer::from_slice(record);
    let shape = ValueShape { timestamps }
        .deserialize(&mut de)
        .map_err(|e| match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                format!("not valid JSON: {e}")
            }
            _ => e.to_string(),
        })?;
    de.end()
        .map_err(|_| "a record holds more than one JSON value".to_string())?;
    match shape {
        Some(Shape::Struct(fields)) => Ok(fields),
        None if record.trim_ascii_start().starts_with(b"{") => Ok(Vec::new()),
        _ => Err("a JSON record must be an object".to_string()),
    }
}

/// Arrow schemas by shape key ([`super::shape_key`]), so that records of one shape share one
/// schema (and the plans and writers keyed by it).
#[derive(Debug, Default)]
pub struct ShapeCache {
    schemas: HashMap<Vec<u8>, SchemaRef>,
    /// What the shapes' keys hold, in bytes (the schemas hold about as much).
    bytes: usize,
}

/// More distinct shapes than this, or shapes' keys of more than [`MAX_SHAPE_BYTES`], and
/// the cache starts afresh (records whose field names are data, say), so that it stays small.
const MAX_SHAPES: usize = 4096;
const MAX_SHAPE_BYTES: usize = 16 << 20;

impl ShapeCache {
    /// The schema of the shape whose key is `key`, if it is known.
    pub fn get(&self, key: &[u8]) -> Option<SchemaRef> {
        self.schemas.get(key).cloned()
    }

    /// The schema of records of shape `fields`, whose key is `key`.
    pub fn schema(&mut self, key: &[u8], fields: &[(String, Shape)]) -> SchemaRef {
        if let Some(s) = self.schemas.get(key) {
            return s.clone();
        }
        if self.schemas.len() >= MAX_SHAPES || self.bytes + key.len() > MAX_SHAPE_BYTES {
            self.schemas.clear();
            self.bytes = 0;
        }
        self.bytes += key.len();
        // Tagged, so that the sink can tell inferred columns ('json.infer.integers').
        let tag = HashMap::from([(INFERRED.to_string(), "true".to_string())]);
        let fields: Vec<Field> = struct_fields(fields)
            .iter()
            .map(|f| f.as_ref().clone().with_metadata(tag.clone()))
            .collect();
        let schema = Arc::new(Schema::new(fields));
        self.schemas.insert(key.to_vec(), schema.clone());
        schema
    }
}

/// One schema that batches of every schema in `schemas` fit, for showing records of several
/// shapes in one table (a preview): fields by name, in order of first appearance; integers
/// and doubles give doubles, structs merge, and any other mix reads as text.
pub fn merge_schemas<'a>(schemas: impl IntoIterator<Item = &'a SchemaRef>) -> SchemaRef {
    let mut fields: Vec<Field> = Vec::new();
    for schema in schemas {
        merge_fields(&mut fields, schema.fields());
    }
    Arc::new(Schema::new(fields))
}

fn merge_fields(into: &mut Vec<Field>, fields: &Fields) {
    for f in fields {
        match into.iter_mut().find(|g| g.name() == f.name()) {
            Some(g) => {
                let t = merge_types(g.data_type(), f.data_type());
                *g = Field::new(g.name(), t, true);
            }
            None => into.push(f.as_ref().clone().with_nullable(true)),
        }
    }
}

fn merge_types(a: &DataType, b: &DataType) -> DataType {
    match (a, b) {
        (a, b) if a == b => a.clone(),
        (DataType::Null, t) | (t, DataType::Null) => t.clone(),
        (DataType::Int64, DataType::Float64) | (DataType::Float64, DataType::Int64) => {
            DataType::Float64
        }
        (DataType::Struct(x), DataType::Struct(y)) => {
            let mut fields: Vec<Field> = x.iter().map(|f| f.as_ref().clone()).collect();
            merge_fields(&mut fields, y);
            DataType::Struct(fields.into())
        }
        (DataType::List(x), DataType::List(y)) => DataType::List(Arc::new(Field::new(
            "item",
            merge_types(x.data_type(), y.data_type()),
            true,
        ))),
        _ => DataType::Utf8,
    }
}

/// `batch` as a batch of `schema` (from [`merge_schemas`]): absent columns NULL, numbers
/// converted, structs filled field by field, values of a different kind shown as text.
pub fn conform_preview(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, String> {
    let n = batch.num_rows();
    let columns = schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) => preview_array(c, f.data_type()),
            None => Ok(new_null_array(f.data_type(), n)),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(n));
    RecordBatch::try_new_with_options(schema.clone(), columns, &options).map_err(|e| e.to_string())
}

fn preview_array(array: &ArrayRef, to: &DataType) -> Result<ArrayRef, String> {
    if array.data_type() == to {
        return Ok(array.clone());
    }
    match (array.data_type(), to) {
        (DataType::Struct(_), DataType::Struct(fields)) => {
            let s = array.as_struct();
            let children = fields
                .iter()
                .map(|f| match s.column_by_name(f.name()) {
                    Some(c) => preview_array(c, f.data_type()),
                    None => Ok(new_null_array(f.data_type(), s.len())),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let out = StructArray::try_new(fields.clone(), children, s.nulls().cloned())
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(out))
        }
        (DataType::List(_), DataType::List(field)) => {
            let l = array.as_list::<i32>();
            let values = preview_array(l.values(), field.data_type())?;
            let out = ListArray::try_new(
                field.clone(),
                l.offsets().clone(),
                values,
                l.nulls().cloned(),
            )
            .map_err(|e| e.to_string())?;
            Ok(Arc::new(out))
        }
        (_, DataType::Utf8) if !can_cast_types(array.data_type(), to) => {
            let options = FormatOptions::default();
            let format =
                ArrayFormatter::try_new(array.as_ref(), &options).map_err(|e| e.to_string())?;
            let text =
                (0..array.len()).map(|i| array.is_valid(i).then(|| format.value(i).to_string()));
            Ok(Arc::new(StringArray::from_iter(text)))
        }
        _ => cast(array, to).map_err(|e| e.to_string()),
    }
}

/// Reads one JSON value into its shape: `None` for null, `[]`, `{}` and containers of those.
#[derive(Clone, Copy)]
struct ValueShape {
    timestamps: bool,
}

impl<'de> DeserializeSeed<'de> for ValueShape {
    type Value = Option<Shape>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueShape {
    type Value = Option<Shape>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Some(Shape::Boolean))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Some(Shape::Long))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        if i64::try_from(v).is_err() {
            return Err(E::custom(format!("the integer {v} does not fit a long")));
        }
        Ok(Some(Shape::Long))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Some(Shape::Double))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        if self.timestamps
            && let Some(tz) = timestamp_kind(v)
        {
            return Ok(Some(Shape::Timestamp(tz)));
        }
        Ok(Some(Shape::String))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut element: Option<Shape> = None;
        while let Some(shape) = seq.next_element_seed(self)? {
            if let Some(shape) = shape {
                element = Some(match element {
                    None => shape,
                    Some(e) => e.merge(shape).map_err(de::Error::custom)?,
                });
            }
        }
        Ok(element.map(|e| Shape::List(Box::new(e))))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // A repeated key: the last value wins (a null one removes the field), as it does when
        // the record is decoded; earlier ones are marked `dropped` (made only once a key
        // repeats). Past a few keys, each key's place is looked up rather than scanned for,
        // so that an object of many keys stays linear.
        let mut fields: Vec<(String, Shape)> = Vec::new();
        let mut dropped: Vec<bool> = Vec::new();
        let mut places: Option<HashMap<String, usize>> = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let shape = map.next_value_seed(self)?;
            let earlier = match &mut places {
                Some(p) => p.remove(key.as_ref()),
                None => fields.iter().enumerate().position(|(i, (n, _))| {
                    n.as_str() == key && !dropped.get(i).is_some_and(|d| *d)
                }),
            };
            if let Some(i) = earlier {
                if dropped.is_empty() {
                    dropped = vec![false; fields.len()];
                }
                dropped[i] = true;
            }
            let Some(shape) = shape else { continue };
            if let Some(p) = &mut places {
                p.insert(key.to_string(), fields.len());
            }
            fields.push((key.into_owned(), shape));
            if !dropped.is_empty() {
                dropped.push(false);
            }
            if places.is_none() && fields.len() > SCANNED_KEYS {
                let kept = |i: &usize| !dropped.get(*i).is_some_and(|d| *d);
                places = Some(
                    fields
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| kept(i))
                        .map(|(i, (n, _))| (n.clone(), i))
                        .collect(),
                );
            }
        }
        if !dropped.is_empty() {
            fields = fields
                .into_iter()
                .zip(dropped)
                .filter_map(|(field, dropped)| (!dropped).then_some(field))
                .collect();
        }
        Ok((!fields.is_empty()).then_some(Shape::Struct(fields)))
    }
}

/// Whether `s` reads as a timestamp (`2024-05-01T10:00:00`, a space instead of `T`, an
/// optional fraction), and if so whether it carries a UTC offset (`Z`, `+02:00`).
pub(crate) fn timestamp_kind(s: &str) -> Option<bool> {
    // Cheap rejection first: most strings are not timestamps.
    let b = s.as_bytes();
    if b.len() < 19 || !b[..4].iter().all(u8::is_ascii_digit) || b[4] != b'-' {
        return None;
    }
    if chrono::DateTime::parse_from_rfc3339(s).is_ok() {
        return Some(true);
    }
    let formats = ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"];
    formats
        .iter()
        .any(|f| chrono::NaiveDateTime::parse_from_str(s, f).is_ok())
        .then_some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(json: &str) -> Result<String, String> {
        let fields = record_shape(json.as_bytes(), false)?;
        Ok(Shape::Struct(fields).to_string())
    }

    #[test]
    fn a_repeated_key_keeps_its_last_value_in_small_and_wide_objects() {
        assert_eq!(
            shape(r#"{"a": 1, "b": 2, "a": "x"}"#).unwrap(),
            r#"{"b":long,"a":string}"#
        );
        assert_eq!(shape(r#"{"a": 1, "a": null}"#).unwrap(), "{}");
        let wide: Vec<String> = (0..40).map(|i| format!("\"k{i}\": {i}")).collect();
        let json = format!("{{{}, \"k3\": \"x\", \"k30\": 1.5}}", wide.join(", "));
        let fields = record_shape(json.as_bytes(), false).unwrap();
        assert_eq!(fields.len(), 40);
        assert_eq!(fields[38], ("k3".to_string(), Shape::String));
        assert_eq!(fields[39], ("k30".to_string(), Shape::Double));
        assert!(fields.iter().filter(|(n, _)| n == "k3").count() == 1);
        // Arrays of wide objects merge their fields by name.
        let merged = format!("{{\"l\": [{{{0}}}, {{{0}, \"new\": 1}}]}}", wide.join(", "));
        let Shape::List(element) = &record_shape(merged.as_bytes(), false).unwrap()[0].1 else {
            panic!()
        };
        let Shape::Struct(fields) = element.as_ref() else {
            panic!()
        };
        assert_eq!(fields.len(), 41);
    }

    #[test]
    fn values_map_to_stable_types() {
        assert_eq!(
            shape(r#"{"a": 1, "b": 1.5, "c": 1e3, "d": "x", "e": true}"#).unwrap(),
            r#"{"a":long,"b":double,"c":double,"d":string,"e":boolean}"#
        );
        assert_eq!(
            shape(r#"{"o": {"x": [1, 2.5]}, "l": [{"a": 1}, {"b": "s"}]}"#).unwrap(),
            r#"{"o":{"x":[double]},"l":[{"a":long,"b":string}]}"#
        );
    }

    #[test]
    fn nulls_and_empty_containers_make_no_field() {
        assert_eq!(
            shape(r#"{"a": null, "b": [], "c": {}, "d": {"x": null}, "e": [null], "f": 1}"#)
                .unwrap(),
            r#"{"f":long}"#
        );
        assert_eq!(shape("{}").unwrap(), "{}");
    }

    #[test]
    fn bad_records_say_why() {
        assert!(shape("[1]").unwrap_err().contains("must be an object"));
        assert!(shape(r#"{"a": [1, "x"]}"#).unwrap_err().contains("mixes"));
        assert!(
            shape(r#"{"a": 1} {"b": 2}"#)
                .unwrap_err()
                .contains("more than one")
        );
        assert!(
            shape(r#"{"a": 18446744073709551615}"#)
                .unwrap_err()
                .contains("fit a long")
        );
        assert!(shape(r#"{"a": "#).is_err());
        assert!(shape("  ").unwrap_err().contains("empty"));
    }

    #[test]
    fn previews_merge_shapes_into_one_schema() {
        use datafusion::arrow::array::Int64Array;
        let a = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, true),
            Field::new(
                "s",
                DataType::Struct(vec![Field::new("x", DataType::Int64, true)].into()),
                true,
            ),
        ]));
        let b = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("new", DataType::Boolean, true),
        ]));
        let merged = merge_schemas([&a, &b]);
        let types: Vec<String> = merged
            .fields()
            .iter()
            .map(|f| f.data_type().to_string())
            .collect();
        assert_eq!(types, vec!["Float64", "Utf8", "Boolean"]);
        let s = StructArray::try_new(
            vec![Field::new("x", DataType::Int64, true)].into(),
            vec![Arc::new(Int64Array::from(vec![7]))],
            None,
        )
        .unwrap();
        let batch = RecordBatch::try_new(a, vec![Arc::new(Int64Array::from(vec![1])), Arc::new(s)])
            .unwrap();
        let out = conform_preview(&batch, &merged).unwrap();
        assert_eq!(
            out.column(0)
                .as_primitive::<datafusion::arrow::datatypes::Float64Type>()
                .value(0),
            1.0
        );
        assert_eq!(out.column(1).as_string::<i32>().value(0), "{x: 7}");
        assert!(out.column(2).is_null(0));
    }

    #[test]
    fn timestamps_only_when_asked() {
        let r =
            br#"{"t": "2024-05-01T10:00:00Z", "n": "2024-05-01 10:00:00.5", "s": "2024-05-01"}"#;
        let on = Shape::Struct(record_shape(r, true).unwrap()).to_string();
        assert_eq!(on, r#"{"t":timestamptz,"n":timestamp,"s":string}"#);
        let off = Shape::Struct(record_shape(r, false).unwrap()).to_string();
        assert_eq!(off, r#"{"t":string,"n":string,"s":string}"#);
    }
}
