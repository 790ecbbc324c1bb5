// Package luaarith holds arith.lua, the exact integer arithmetic (fdiv,
// cdiv, ifmt) that every Redis script of the store starts with: the
// guard's decisions (package redisstore) and a region's share ledger
// (package regionstore), which the region script runs together.
package luaarith

import _ "embed"

// Source is arith.lua; its header states its functions.
//
//go:embed arith.lua
var Source string
