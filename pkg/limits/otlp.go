package limits

import (
	"fmt"

	"github.com/prometheus/otlptranslator"
	"github.com/prometheus/prometheus/config"
	"gopkg.in/yaml.v3"
)

// OTLP is how a tenant's OTLP metrics are translated to Prometheus series
// (pkg/ingest's OTLP endpoint). The fields and their YAML names are
// Prometheus' own `otlp:` configuration block, so a Prometheus user's block
// can be pasted into a tenant's overrides; the last two are what Prometheus
// sets by feature flag or not at all:
//
//	overrides:
//	  training:
//	    otlp:
//	      translation_strategy: NoUTF8EscapingWithSuffixes
//	      promote_resource_attributes: [k8s.namespace.name, k8s.pod.name]
//	      convert_delta_to_cumulative: true
type OTLP struct {
	TranslationStrategy                  otlptranslator.TranslationStrategyOption `yaml:"translation_strategy"`
	PromoteAllResourceAttributes         bool                                     `yaml:"promote_all_resource_attributes"`
	PromoteResourceAttributes            []string                                 `yaml:"promote_resource_attributes,omitempty"`
	IgnoreResourceAttributes             []string                                 `yaml:"ignore_resource_attributes,omitempty"`
	KeepIdentifyingResourceAttributes    bool                                     `yaml:"keep_identifying_resource_attributes"`
	ConvertHistogramsToNHCB              bool                                     `yaml:"convert_histograms_to_nhcb"`
	PromoteScopeMetadata                 bool                                     `yaml:"promote_scope_metadata"`
	LabelNameUnderscoreSanitization      bool                                     `yaml:"label_name_underscore_sanitization"`
	LabelNamePreserveMultipleUnderscores bool                                     `yaml:"label_name_preserve_multiple_underscores"`
	// ConvertDeltaToCumulative adds delta sums and histograms up into
	// cumulative ones (Prometheus' --enable-feature=otlp-deltatocumulative);
	// without it they are rejected, as Prometheus does by default.
	ConvertDeltaToCumulative bool `yaml:"convert_delta_to_cumulative"`
	// DisableTargetInfo leaves out the target_info series of each resource.
	DisableTargetInfo bool `yaml:"disable_target_info"`
}

// DefaultOTLP is Prometheus' default OTLP configuration.
func DefaultOTLP() OTLP {
	d := config.DefaultOTLPConfig
	return OTLP{
		TranslationStrategy:                  d.TranslationStrategy,
		LabelNameUnderscoreSanitization:      d.LabelNameUnderscoreSanitization,
		LabelNamePreserveMultipleUnderscores: d.LabelNamePreserveMultipleUnderscores,
	}
}

// Prometheus returns the settings as Prometheus' configuration block, which
// its translator reads.
func (o OTLP) Prometheus() config.OTLPConfig {
	return config.OTLPConfig{
		PromoteAllResourceAttributes:         o.PromoteAllResourceAttributes,
		PromoteResourceAttributes:            o.PromoteResourceAttributes,
		IgnoreResourceAttributes:             o.IgnoreResourceAttributes,
		TranslationStrategy:                  o.TranslationStrategy,
		KeepIdentifyingResourceAttributes:    o.KeepIdentifyingResourceAttributes,
		ConvertHistogramsToNHCB:              o.ConvertHistogramsToNHCB,
		PromoteScopeMetadata:                 o.PromoteScopeMetadata,
		LabelNameUnderscoreSanitization:      o.LabelNameUnderscoreSanitization,
		LabelNamePreserveMultipleUnderscores: o.LabelNamePreserveMultipleUnderscores,
	}
}

// Validate checks the settings with Prometheus' own rules: its block's
// YAML checks (promote and ignore lists), and the strategies its
// configuration accepts (gpustore stores UTF-8 names, so all four).
func (o OTLP) Validate() error {
	switch o.TranslationStrategy {
	case otlptranslator.UnderscoreEscapingWithSuffixes, otlptranslator.UnderscoreEscapingWithoutSuffixes,
		otlptranslator.NoUTF8EscapingWithSuffixes, otlptranslator.NoTranslation:
	default:
		return fmt.Errorf("otlp.translation_strategy %q: want one of %s, %s, %s, %s", o.TranslationStrategy,
			otlptranslator.UnderscoreEscapingWithSuffixes, otlptranslator.UnderscoreEscapingWithoutSuffixes,
			otlptranslator.NoUTF8EscapingWithSuffixes, otlptranslator.NoTranslation)
	}
	b, err := yaml.Marshal(o.Prometheus())
	if err != nil {
		return err
	}
	var check config.OTLPConfig
	if err := yaml.Unmarshal(b, &check); err != nil {
		return fmt.Errorf("otlp: %w", err)
	}
	return nil
}
