//! The schema registry: row field names by schema id (see `eddy_wire::schema`), declared by
//! guests through the `schemas` import and by host sources, read by guests and by the host's
//! edges (sinks, `key_by` pointers, window results).
//!
//! Ids are content hashes, so one registry serves every job of the process: the same names
//! always get the same id and nothing needs coordinating. A hostile guest can only add
//! entries within the bounds below; an id whose names differ from an earlier declaration (a
//! 32-bit collision) traps the declaring guest rather than renaming anyone's fields.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use eddy_wire::schema::{Schema, Schemas};

use crate::error::{HostTrap, Violation};

/// Most fields a declared schema may name.
pub const MAX_SCHEMA_FIELDS: usize = 4096;
/// Longest record or field name.
pub const MAX_SCHEMA_NAME_BYTES: usize = 256;
/// Most schemas one process holds.
pub const MAX_SCHEMAS: usize = 65_536;

/// Why a schema was not registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// Too many fields, a name too long, or the registry is full.
    #[error("{what} of {actual} exceeds the limit of {limit}")]
    Limit {
        /// What was too big.
        what: &'static str,
        /// The limit.
        limit: usize,
        /// What was asked.
        actual: usize,
    },
    /// Another schema already has this id.
    #[error("schema `{name}` hashes to id {id:#010x}, which schema `{other}` already has; rename a field")]
    Collision {
        /// The id.
        id: u32,
        /// The schema being declared.
        name: String,
        /// The one registered first.
        other: String,
    },
}

/// Schemas by id.
#[derive(Debug, Default)]
pub struct SchemaRegistry {
    by_id: RwLock<HashMap<u32, Arc<Schema>>>,
}

impl SchemaRegistry {
    /// Registers `schema` (again: a no-op); returns its id.
    pub fn declare(&self, schema: &Schema) -> Result<u32, SchemaError> {
        let limit =
            |what, limit, actual| if actual > limit { Err(SchemaError::Limit { what, limit, actual }) } else { Ok(()) };
        limit("schema fields", MAX_SCHEMA_FIELDS, schema.fields.len())?;
        for name in std::iter::once(&schema.name).chain(&schema.fields) {
            limit("schema name bytes", MAX_SCHEMA_NAME_BYTES, name.len())?;
        }
        let id = schema.id();
        if let Some(known) = self.get(id) {
            return if *known == *schema {
                Ok(id)
            } else {
                Err(SchemaError::Collision { id, name: schema.name.clone(), other: known.name.clone() })
            };
        }
        let mut by_id = self.by_id.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        limit("schemas", MAX_SCHEMAS - 1, by_id.len())?;
        by_id.entry(id).or_insert_with(|| Arc::new(schema.clone()));
        Ok(id)
    }
}

impl Schemas for SchemaRegistry {
    fn get(&self, id: u32) -> Option<Arc<Schema>> {
        self.by_id.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(&id).cloned()
    }
}

/// The process's registry.
pub fn schemas() -> &'static SchemaRegistry {
    static REGISTRY: LazyLock<SchemaRegistry> = LazyLock::new(SchemaRegistry::default);
    &REGISTRY
}

/// The `schemas` import, the same for both worlds.
pub(crate) fn declare_import(name: String, fields: Vec<String>) -> wasmtime::Result<u32> {
    schemas()
        .declare(&Schema { name, fields })
        .map_err(|e| wasmtime::Error::new(HostTrap::from(Violation::BadDeclaration(e.to_string()))))
}

/// The `schema-fields` import.
pub(crate) fn fields_import(id: u32) -> Option<(String, Vec<String>)> {
    schemas().get(id).map(|s| (s.name.clone(), s.fields.clone()))
}

macro_rules! schemas_host {
    ($host:ty) => {
        impl crate::bindings::schemas::Host for $host {
            fn declare_schema(&mut self, name: String, fields: Vec<String>) -> wasmtime::Result<u32> {
                let id = crate::schemas::declare_import(name, fields)?;
                crate::sandbox::HasSandbox::sandbox(self).note_schema(id);
                Ok(id)
            }

            fn schema_fields(&mut self, id: u32) -> wasmtime::Result<Option<(String, Vec<String>)>> {
                Ok(crate::schemas::fields_import(id))
            }
        }
    };
}
pub(crate) use schemas_host;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_registers_once_and_a_colliding_one_is_refused() {
        let registry = SchemaRegistry::default();
        let bid = Schema::new("bid", &["auction", "price"]);
        let id = registry.declare(&bid).expect("new");
        assert_eq!(registry.declare(&bid), Ok(id));
        assert_eq!(registry.get(id).as_deref(), Some(&bid));
        // A second schema that claims the same id: forge one by writing the map directly.
        let other = Schema::new("other", &["x"]);
        registry.by_id.write().expect("lock").insert(other.id(), Arc::new(bid.clone()));
        assert!(matches!(registry.declare(&other), Err(SchemaError::Collision { .. })));
        let wide = Schema { name: "wide".into(), fields: (0..=MAX_SCHEMA_FIELDS).map(|i| i.to_string()).collect() };
        assert!(matches!(registry.declare(&wide), Err(SchemaError::Limit { what: "schema fields", .. })));
        let long = Schema::new("long", &[&"x".repeat(MAX_SCHEMA_NAME_BYTES + 1)]);
        assert!(matches!(registry.declare(&long), Err(SchemaError::Limit { what: "schema name bytes", .. })));
    }
}
