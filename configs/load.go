package configs

// Checked is a pointer to a binary's configuration, which fills its own
// defaults and validates itself.
type Checked[C any] interface {
	*C
	SetDefaults()
	Validate() error
}

// LoadChecked loads a configuration of type C the way the binaries do:
// Load (the YAML file at path, none when empty, then the TOLLGATE_*
// environment through lookup; nil means os.LookupEnv), then SetDefaults and
// Validate.
func LoadChecked[C any, P Checked[C]](path string, lookup LookupFunc) (C, error) {
	var c C
	if err := Load(&c, path, lookup); err != nil {
		return c, err
	}
	P(&c).SetDefaults()
	return c, P(&c).Validate()
}

// DefaultVars lists every variable of a configuration of type C with the
// defaults SetDefaults gives it, for --help. hostSpecific, when not nil,
// clears the defaults that depend on the host (an id made of the host
// name), which their doc tags describe instead.
func DefaultVars[C any, P Checked[C]](hostSpecific func(*C)) ([]Var, error) {
	var c C
	P(&c).SetDefaults()
	if hostSpecific != nil {
		hostSpecific(&c)
	}
	return Vars(&c, nil)
}
