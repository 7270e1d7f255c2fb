//! The JSON names of unit enums, read from their `Serialize` impl.
//!
//! The serde attributes (`rename_all = "snake_case"`, a `rename` here and there) are the one
//! source of every name: `as_str` asks serde which string it would write instead of repeating
//! the names in a second table that could drift.

use std::fmt;

use serde::ser::{Impossible, Serialize, Serializer};

/// The name serde writes for `value`, a unit variant of an enum deriving `Serialize`.
///
/// # Panics
///
/// If `value` does not serialize as a unit variant: a programming error caught by every test
/// that names the enum (each `as_str` has one).
pub(crate) fn of<T: Serialize>(value: &T) -> &'static str {
    match value.serialize(VariantName) {
        Ok(name) => name,
        Err(NotAUnitVariant) => panic!("names::of is for unit enum variants only"),
    }
}

/// A serializer that accepts exactly one thing: a unit variant, and returns its name.
struct VariantName;

#[derive(Debug)]
struct NotAUnitVariant;

impl fmt::Display for NotAUnitVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a unit variant")
    }
}

impl std::error::Error for NotAUnitVariant {}

impl serde::ser::Error for NotAUnitVariant {
    fn custom<T: fmt::Display>(_msg: T) -> Self {
        NotAUnitVariant
    }
}

/// Every method but `serialize_unit_variant` refuses.
macro_rules! refuse {
    ($($method:ident($($ty:ty),*);)*) => {
        $(fn $method(self, $(_: $ty),*) -> Result<Self::Ok, Self::Error> {
            Err(NotAUnitVariant)
        })*
    };
}

impl Serializer for VariantName {
    type Ok = &'static str;
    type Error = NotAUnitVariant;
    type SerializeSeq = Impossible<Self::Ok, Self::Error>;
    type SerializeTuple = Impossible<Self::Ok, Self::Error>;
    type SerializeTupleStruct = Impossible<Self::Ok, Self::Error>;
    type SerializeTupleVariant = Impossible<Self::Ok, Self::Error>;
    type SerializeMap = Impossible<Self::Ok, Self::Error>;
    type SerializeStruct = Impossible<Self::Ok, Self::Error>;
    type SerializeStructVariant = Impossible<Self::Ok, Self::Error>;

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<Self::Ok, Self::Error> {
        Ok(variant)
    }

    refuse! {
        serialize_bool(bool);
        serialize_i8(i8);
        serialize_i16(i16);
        serialize_i32(i32);
        serialize_i64(i64);
        serialize_u8(u8);
        serialize_u16(u16);
        serialize_u32(u32);
        serialize_u64(u64);
        serialize_f32(f32);
        serialize_f64(f64);
        serialize_char(char);
        serialize_str(&str);
        serialize_bytes(&[u8]);
        serialize_none();
        serialize_unit();
        serialize_unit_struct(&'static str);
    }

    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<Self::Ok, Self::Error> {
        Err(NotAUnitVariant)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<Self::Ok, Self::Error> {
        Err(NotAUnitVariant)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Self::Ok, Self::Error> {
        Err(NotAUnitVariant)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Self::Error> {
        Err(NotAUnitVariant)
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Self::Error> {
        Err(NotAUnitVariant)
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Self::Error> {
        Err(NotAUnitVariant)
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Self::Error> {
        Err(NotAUnitVariant)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Self::Error> {
        Err(NotAUnitVariant)
    }

    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, Self::Error> {
        Err(NotAUnitVariant)
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Self::Error> {
        Err(NotAUnitVariant)
    }
}

#[cfg(test)]
#[cfg(not(lameduck_loom))] // the docs are read with syn, a dev-dependency outside the loom build
mod tests;
