//! Long-form guides.

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
#[doc = include_str!("docs/kubernetes.md")]
pub mod kubernetes {}
