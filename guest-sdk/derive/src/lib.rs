//! `#[derive(Row)]` for `eddy-sdk`: the code that reads and writes a struct as a row with its
//! layout fixed at compile time, instead of serde's visitor asking for each field by name.
//!
//! The generated impls are `eddy_sdk::RowRead` and `eddy_sdk::RowWrite`. Reading resolves
//! the struct's field names to slots once per schema id (remembered per thread) and then
//! reads each slot at its index; a slot holding another kind than the field's type takes, a
//! missing field or a value that is not a row returns `None`, and `Record::row` then reads the
//! value with serde, so the result never differs from `Record::value`. Writing declares the
//! struct's schema once and writes each field into its slot: the bytes are those serde's row
//! encoder writes for the same struct (tested). So that both stay true, the derive refuses
//! what would make serde see another shape: generics, `#[serde(...)]` attributes, tuple and
//! unit structs and enums. A field's type must implement `eddy_sdk::row::Slot` (the compiler
//! says so at the field otherwise).

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, parse_macro_input};

/// Derives `eddy_sdk::RowRead` and `eddy_sdk::RowWrite` for a struct with named fields of
/// slot types (`eddy_sdk::row::Slot`): `u8`–`u64`, `i8`–`i64`, `f32`, `f64`, `bool`,
/// `String`, `Option` of any of them, and types of the user's implementing it.
#[proc_macro_derive(Row)]
pub fn derive_row(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// An identifier as serde names it: a raw one (`r#type`) without its prefix.
fn unraw(ident: &syn::Ident) -> String {
    let text = ident.to_string();
    text.strip_prefix("r#").map_or_else(|| text.clone(), str::to_owned)
}

fn refuse_serde_attributes(attrs: &[syn::Attribute], what: &str) -> syn::Result<()> {
    match attrs.iter().find(|a| a.path().is_ident("serde")) {
        Some(a) => Err(syn::Error::new(
            a.span(),
            format!(
                "derive(Row) writes the {what} as serde would without attributes; remove `#[serde(...)]` here, or read and write this struct with `record.value()` and `ctx.emit_value()`"
            ),
        )),
        None => Ok(()),
    }
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let name = &input.ident;
    if !input.generics.params.is_empty() {
        return Err(syn::Error::new(
            input.generics.span(),
            "derive(Row) takes a struct without generic or lifetime parameters (fields own their values; borrow a string field with `record.value_str`)",
        ));
    }
    refuse_serde_attributes(&input.attrs, "struct")?;
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new(input.span(), "derive(Row) takes a struct with named fields"));
    };
    let Fields::Named(named) = &data.fields else {
        return Err(syn::Error::new(data.fields.span(), "derive(Row) takes a struct with named fields"));
    };
    let mut names = Vec::new();
    let mut reads = Vec::new();
    let mut writes = Vec::new();
    for (i, field) in named.named.iter().enumerate() {
        refuse_serde_attributes(&field.attrs, "field")?;
        let Some(ident) = &field.ident else { continue };
        let ty = &field.ty;
        let text = unraw(ident);
        let span = ty.span();
        reads.push(quote_spanned! {span=>
            #ident: <#ty as ::eddy_sdk::row::Slot>::read(row, usize::from(slots[#i]))?
        });
        writes.push(quote_spanned! {span=>
            <#ty as ::eddy_sdk::row::Slot>::write(&self.#ident, &frame, buf, #i)
        });
        names.push(text);
    }
    let count = names.len();
    let type_name = unraw(name);
    let layout = format_ident!("__EDDY_ROW_SLOTS");
    let schema = format_ident!("__EDDY_ROW_SCHEMA");
    Ok(quote! {
        impl ::eddy_sdk::RowRead for #name {
            #[inline]
            fn read_row(row: &::eddy_sdk::__private::row::RowRef<'_>) -> ::core::option::Option<Self> {
                ::std::thread_local! {
                    static #layout: ::eddy_sdk::__private::row::Layout<#count> =
                        const { ::core::cell::Cell::new(::core::option::Option::None) };
                }
                const NAMES: [&str; #count] = [#(#names),*];
                let slots = ::eddy_sdk::__private::row::slots(row, &#layout, &NAMES)?;
                ::core::option::Option::Some(Self { #(#reads),* })
            }
        }

        impl ::eddy_sdk::RowWrite for #name {
            #[inline]
            fn write_row(&self, buf: &mut ::std::vec::Vec<u8>) {
                ::std::thread_local! {
                    static #schema: ::core::cell::Cell<::core::option::Option<u32>> =
                        const { ::core::cell::Cell::new(::core::option::Option::None) };
                }
                const NAMES: [&str; #count] = [#(#names),*];
                let id = ::eddy_sdk::__private::row::declared(&#schema, #type_name, &NAMES);
                let frame = ::eddy_sdk::__private::row::RowFrame::begin(buf, #count, id);
                #(#writes;)*
            }
        }
    })
}
