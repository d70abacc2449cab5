// Module types for files the store imports with import attributes; Bun resolves them at
// bundle time (`type: "text"` gives the contents, `type: "file"` gives a path Bun.file can read,
// which inside a compiled binary points into the embedded filesystem).
declare module "*.sql" {
  const text: string;
  export default text;
}
declare module "*.wasm" {
  const path: string;
  export default path;
}
declare module "*.data" {
  const path: string;
  export default path;
}
