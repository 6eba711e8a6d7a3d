package sqlite

// Migrations are the schema's versions, for tests that make a store of an
// earlier version.
var Migrations = migrations
