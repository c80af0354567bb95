// Package check decodes what `helm template` renders from the chart in
// deploy/helm/hintstream strictly against the Go types of the API servers
// that would receive it: Kubernetes' own (k8s.io/api), KEDA's ScaledObject
// and TriggerAuthentication, and the Prometheus operator's ServiceMonitor and
// PrometheusRule. A field that is unknown, misspelt or of the wrong type
// fails, as a kind no type is registered for does. It then checks what the
// chart promises: worker ids from pod names, probes, scaling bounds, the
// alert rules equal to deploy/prometheus/alerts.yml, and a configuration the
// stages load.
//
// scripts/helm.sh check renders each ci/*-values.yaml into $RENDERED and runs
// this test with RENDERED, CHART, REPO, HELM and HINTSTREAM_BIN set.
package check

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// The trigger-metadata keys KEDA's kafka scaler reads.
var kafkaScalerMetadata = map[string]bool{
	"bootstrapServers": true, "consumerGroup": true, "topic": true, "partitionLimitation": true,
	"lagThreshold": true, "activationLagThreshold": true, "offsetResetPolicy": true,
	"allowIdleConsumers": true, "excludePersistentLag": true, "scaleToZeroOnInvalidOffset": true,
	"limitToPartitionsWithLag": true, "ensureEvenDistributionOfPartitions": true, "version": true,
	"tls": true, "unsafeSsl": true, "sasl": true, "saslTokenProvider": true, "awsRegion": true,
}

// The values files scripts/helm.sh renders (ci/<case>-values.yaml).
var cases = []string{"default", "exactly-once", "secured", "keda-off"}

func env(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run this test through scripts/helm.sh check", name)
	}
	return v
}

// The strict decoder: apimachinery's JSON/YAML serializer in strict mode,
// over a scheme that knows only the types the chart may render.
func strictDecoder(t *testing.T) runtime.Decoder {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		appsv1.AddToScheme,
		batchv1.AddToScheme,
		corev1.AddToScheme,
		policyv1.AddToScheme,
		kedav1alpha1.AddToScheme,
		monitoringv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	return json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme,
		json.SerializerOptions{Yaml: true, Strict: true})
}

// documents splits a multi-document YAML stream, dropping empty documents.
func documents(t *testing.T, data []byte) [][]byte {
	t.Helper()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) > 0 {
			docs = append(docs, doc)
		}
	}
}

func stripComments(doc []byte) []byte {
	var out []string
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			out = append(out, line)
		}
	}
	return []byte(strings.Join(out, "\n"))
}

// rendered is one values file's manifests, decoded.
type rendered struct {
	objects      []runtime.Object
	statefulSets map[string]*appsv1.StatefulSet
	services     map[string]*corev1.Service
	configMaps   map[string]*corev1.ConfigMap
	scaled       map[string]*kedav1alpha1.ScaledObject
	triggerAuths map[string]*kedav1alpha1.TriggerAuthentication
	monitors     map[string]*monitoringv1.ServiceMonitor
	rules        []*monitoringv1.PrometheusRule
	pdbs         map[string]*policyv1.PodDisruptionBudget
	jobs         map[string]*batchv1.Job
}

func decodeAll(t *testing.T, decoder runtime.Decoder, data []byte) (*rendered, error) {
	r := &rendered{
		statefulSets: map[string]*appsv1.StatefulSet{},
		services:     map[string]*corev1.Service{},
		configMaps:   map[string]*corev1.ConfigMap{},
		scaled:       map[string]*kedav1alpha1.ScaledObject{},
		triggerAuths: map[string]*kedav1alpha1.TriggerAuthentication{},
		monitors:     map[string]*monitoringv1.ServiceMonitor{},
		pdbs:         map[string]*policyv1.PodDisruptionBudget{},
		jobs:         map[string]*batchv1.Job{},
	}
	for i, doc := range documents(t, data) {
		obj, gvk, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w\n%s", i, err, doc)
		}
		r.objects = append(r.objects, obj)
		switch o := obj.(type) {
		case *appsv1.StatefulSet:
			r.statefulSets[o.Name] = o
		case *corev1.Service:
			r.services[o.Name] = o
		case *corev1.ConfigMap:
			r.configMaps[o.Name] = o
		case *corev1.ServiceAccount:
		case *kedav1alpha1.ScaledObject:
			r.scaled[o.Name] = o
		case *kedav1alpha1.TriggerAuthentication:
			r.triggerAuths[o.Name] = o
		case *monitoringv1.ServiceMonitor:
			r.monitors[o.Name] = o
		case *monitoringv1.PrometheusRule:
			r.rules = append(r.rules, o)
		case *policyv1.PodDisruptionBudget:
			r.pdbs[o.Name] = o
		case *batchv1.Job:
			r.jobs[o.Name] = o
		default:
			return nil, fmt.Errorf("document %d: %v is rendered but nothing here checks it", i, gvk)
		}
	}
	return r, nil
}

func load(t *testing.T, name string) *rendered {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(env(t, "RENDERED"), name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := decodeAll(t, strictDecoder(t), data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

// The configuration the chart renders, as the stages would read it.
type hintstreamConfig struct {
	BootstrapServers string                   `toml:"bootstrap_servers"`
	Kafka            map[string]any           `toml:"kafka"`
	Topics           struct{ Partitions int } `toml:"topics"`
	Hints            stageConfig              `toml:"hints"`
	Advantages       stageConfig              `toml:"advantages"`
}

type stageConfig struct {
	GroupID          string `toml:"group_id"`
	InputTopic       string `toml:"input_topic"`
	MetricsAddr      string `toml:"metrics_addr"`
	DrainTimeoutSecs int    `toml:"drain_timeout_secs"`
}

func (r *rendered) config(t *testing.T) (string, hintstreamConfig) {
	t.Helper()
	for name, cm := range r.configMaps {
		if strings.HasSuffix(name, "-topics") {
			continue
		}
		text := cm.Data["hintstream.toml"]
		var c hintstreamConfig
		if _, err := toml.Decode(text, &c); err != nil {
			t.Fatalf("ConfigMap %s: hintstream.toml is not TOML: %v\n%s", name, err, text)
		}
		return text, c
	}
	t.Fatal("no ConfigMap with hintstream.toml")
	return "", hintstreamConfig{}
}

func TestEveryValuesFileRendersManifestsThatDecodeStrictly(t *testing.T) {
	for _, name := range cases {
		r := load(t, name)
		kinds := map[string]int{}
		for _, o := range r.objects {
			kinds[fmt.Sprintf("%T", o)]++
		}
		t.Logf("%s: %v", name, kinds)
	}
}

func TestStrictDecodingRefusesUnknownAndMisspeltFields(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(env(t, "RENDERED"), "default.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	decoder := strictDecoder(t)
	for _, mutation := range []struct{ from, to string }{
		{"podManagementPolicy: Parallel", "podManagmentPolicy: Parallel"},
		{"pollingInterval:", "pollingIntervall:"},
		{"cooldownPeriod:", "cooldownPeriods:"},
		{"jobLabel: app.kubernetes.io/component", "jobLabels: app.kubernetes.io/component"},
		{"maxUnavailable: 1", "maxUnavailable: 1\n  maxUnavalable: 1"},
		{"publishNotReadyAddresses: true", "publishNotReadyAddresses: yes-please"},
		{"kind: ScaledObject", "kind: ScaledObjekt"},
	} {
		if !bytes.Contains(data, []byte(mutation.from)) {
			t.Fatalf("the default rendering has no %q to mutate", mutation.from)
		}
		mutated := bytes.Replace(data, []byte(mutation.from), []byte(mutation.to), 1)
		if _, err := decodeAll(t, decoder, mutated); err == nil {
			t.Errorf("%q -> %q decoded without an error", mutation.from, mutation.to)
		}
	}
}

func TestEachWorkerIsAStatefulSetPodNamedByItsWorkerID(t *testing.T) {
	for _, name := range cases {
		r := load(t, name)
		if len(r.statefulSets) != 2 {
			t.Fatalf("%s: %d StatefulSets, want 2 (hints, advantages)", name, len(r.statefulSets))
		}
		for ssName, ss := range r.statefulSets {
			where := name + ": StatefulSet " + ssName
			if ss.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
				t.Errorf("%s: podManagementPolicy %q, want Parallel", where, ss.Spec.PodManagementPolicy)
			}
			svc, ok := r.services[ss.Spec.ServiceName]
			if !ok || svc.Spec.ClusterIP != corev1.ClusterIPNone {
				t.Errorf("%s: serviceName %q is no headless Service of the chart", where, ss.Spec.ServiceName)
			}
			containers := ss.Spec.Template.Spec.Containers
			if len(containers) != 1 {
				t.Fatalf("%s: %d containers", where, len(containers))
			}
			c := containers[0]
			var workerID *corev1.EnvVar
			for i := range c.Env {
				if c.Env[i].Name == "HINTSTREAM_WORKER_ID" {
					workerID = &c.Env[i]
				}
			}
			if workerID == nil || workerID.ValueFrom == nil || workerID.ValueFrom.FieldRef == nil ||
				workerID.ValueFrom.FieldRef.FieldPath != "metadata.name" {
				t.Errorf("%s: HINTSTREAM_WORKER_ID is not the pod's name through the downward API: %+v", where, workerID)
			}
			probes := map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe}
			want := map[string]string{"liveness": "/healthz", "readiness": "/readyz", "startup": "/healthz"}
			for kind, probe := range probes {
				if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != want[kind] || probe.HTTPGet.Port.String() != "metrics" {
					t.Errorf("%s: %s probe %+v, want GET %s on port metrics", where, kind, probe, want[kind])
				}
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("%s: resources %+v: want cpu and memory requests and a memory limit", where, c.Resources)
			}
			if grace := ss.Spec.Template.Spec.TerminationGracePeriodSeconds; grace == nil || *grace <= 20 {
				t.Errorf("%s: terminationGracePeriodSeconds %v must exceed the drain timeout", where, grace)
			}
		}
	}
}

func TestScaledObjectsFollowTheLagOfTheirStagesGroupWithinThePartitions(t *testing.T) {
	for _, name := range cases {
		r := load(t, name)
		_, config := r.config(t)
		if name == "keda-off" {
			if len(r.scaled)+len(r.triggerAuths) != 0 {
				t.Errorf("keda-off: %d ScaledObjects, %d TriggerAuthentications", len(r.scaled), len(r.triggerAuths))
			}
			for ssName, ss := range r.statefulSets {
				if ss.Spec.Replicas == nil {
					t.Errorf("keda-off: StatefulSet %s has no replica count", ssName)
				}
			}
			continue
		}
		if len(r.scaled) != 2 {
			t.Fatalf("%s: %d ScaledObjects, want one per stage", name, len(r.scaled))
		}
		for soName, so := range r.scaled {
			where := name + ": ScaledObject " + soName
			ss, ok := r.statefulSets[so.Spec.ScaleTargetRef.Name]
			if !ok || so.Spec.ScaleTargetRef.Kind != "StatefulSet" {
				t.Fatalf("%s: targets %+v, not a rendered StatefulSet", where, so.Spec.ScaleTargetRef)
			}
			if ss.Spec.Replicas != nil {
				t.Errorf("%s: its StatefulSet sets replicas, which each upgrade would reset under KEDA", where)
			}
			stage := config.Hints
			if strings.HasSuffix(soName, "-advantages") {
				stage = config.Advantages
			}
			if so.Spec.MaxReplicaCount == nil || int(*so.Spec.MaxReplicaCount) > config.Topics.Partitions {
				t.Errorf("%s: maxReplicaCount %v above the %d partitions", where, so.Spec.MaxReplicaCount, config.Topics.Partitions)
			}
			if so.Spec.CooldownPeriod == nil || so.Spec.Advanced == nil || so.Spec.Advanced.HorizontalPodAutoscalerConfig == nil ||
				so.Spec.Advanced.HorizontalPodAutoscalerConfig.Behavior.ScaleDown.StabilizationWindowSeconds == nil {
				t.Errorf("%s: no cooldown (cooldownPeriod and the HPA's scale-down window)", where)
			}
			if len(so.Spec.Triggers) != 1 || so.Spec.Triggers[0].Type != "kafka" {
				t.Fatalf("%s: triggers %+v, want one kafka trigger", where, so.Spec.Triggers)
			}
			m := so.Spec.Triggers[0].Metadata
			if m["consumerGroup"] != stage.GroupID || m["topic"] != stage.InputTopic || m["bootstrapServers"] != config.BootstrapServers {
				t.Errorf("%s: trigger %v does not watch the stage's group %q on %q at %q", where, m, stage.GroupID, stage.InputTopic, config.BootstrapServers)
			}
			if m["allowIdleConsumers"] != "false" || m["lagThreshold"] == "" || m["offsetResetPolicy"] != "earliest" {
				t.Errorf("%s: trigger %v", where, m)
			}
			// Trigger metadata is a map of strings in KEDA's types, so the
			// strict decoder cannot see a misspelt key: these are the
			// trigger-metadata keys of KEDA's kafka scaler (v2.21,
			// pkg/scalers/kafka_scaler.go, kafkaMetadata).
			for key := range m {
				if !kafkaScalerMetadata[key] {
					t.Errorf("%s: %q is not a metadata key of KEDA's kafka scaler", where, key)
				}
			}
			auth := so.Spec.Triggers[0].AuthenticationRef
			if name == "secured" {
				if auth == nil || r.triggerAuths[auth.Name] == nil {
					t.Fatalf("%s: no TriggerAuthentication for the secured cluster", where)
				}
				params := map[string]string{}
				for _, ref := range r.triggerAuths[auth.Name].Spec.SecretTargetRef {
					params[ref.Parameter] = ref.Name + "/" + ref.Key
				}
				wantParams := map[string]string{
					"username": "hintstream-kafka-user/user", "password": "hintstream-kafka-user/password",
					"ca": "kafka-cluster-ca/ca.crt", "cert": "kafka-cluster-ca/tls.crt", "key": "kafka-cluster-ca/tls.key",
				}
				if !reflect.DeepEqual(params, wantParams) {
					t.Errorf("%s: TriggerAuthentication %v, want %v", where, params, wantParams)
				}
				if m["sasl"] != "scram_sha512" || m["tls"] != "enable" {
					t.Errorf("%s: sasl %q tls %q", where, m["sasl"], m["tls"])
				}
			} else if auth != nil {
				t.Errorf("%s: an authenticationRef on a plaintext cluster", where)
			}
		}
	}
}

func TestSecretsComeFromExistingSecretsOnly(t *testing.T) {
	r := load(t, "secured")
	text, config := r.config(t)
	if config.Kafka["sasl.password"] != "${KAFKA_SASL_PASSWORD}" {
		t.Errorf("the SASL password is not taken from the environment:\n%s", text)
	}
	if config.Kafka["ssl.ca.location"] != "/etc/hintstream-tls/ca.crt" {
		t.Errorf("ssl.ca.location %v", config.Kafka["ssl.ca.location"])
	}
	for ssName, ss := range r.statefulSets {
		refs := map[string]string{}
		for _, e := range ss.Spec.Template.Spec.Containers[0].Env {
			secretNamed := strings.Contains(e.Name, "KEY") || strings.Contains(e.Name, "PASSWORD")
			if secretNamed && e.Value != "" {
				t.Errorf("StatefulSet %s: %s has a literal value", ssName, e.Name)
			}
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				refs[e.Name] = e.ValueFrom.SecretKeyRef.Name
			}
		}
		if refs["KAFKA_SASL_PASSWORD"] != "hintstream-kafka-user" || refs["KAFKA_SASL_USERNAME"] != "hintstream-kafka-user" {
			t.Errorf("StatefulSet %s: SASL credentials %v", ssName, refs)
		}
		_, hasKey := refs["ANTHROPIC_API_KEY"]
		if hasKey != strings.HasSuffix(ssName, "-hints") {
			t.Errorf("StatefulSet %s: ANTHROPIC_API_KEY from a Secret: %v (stage 1 only)", ssName, hasKey)
		}
	}
}

func TestPrometheusRuleHasTheRulesOfAlertsYml(t *testing.T) {
	repo := env(t, "REPO")
	source, err := os.ReadFile(filepath.Join(repo, "deploy/prometheus/alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	copied, err := os.ReadFile(filepath.Join(env(t, "CHART"), "files/alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(source, copied) {
		t.Errorf("deploy/helm/hintstream/files/alerts.yml differs from deploy/prometheus/alerts.yml, their one source: cp deploy/prometheus/alerts.yml deploy/helm/hintstream/files/alerts.yml")
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(source, &want); err != nil {
		t.Fatalf("alerts.yml as a PrometheusRule spec: %v", err)
	}
	r := load(t, "default")
	if len(r.rules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(r.rules))
	}
	if !reflect.DeepEqual(r.rules[0].Spec, want) {
		got, _ := yaml.Marshal(r.rules[0].Spec)
		t.Errorf("the PrometheusRule's groups differ from alerts.yml:\n%s", got)
	}
	// The alerts select job="hints" / job="advantages": the ServiceMonitors
	// must name the jobs so.
	for name, m := range r.monitors {
		if m.Spec.JobLabel != "app.kubernetes.io/component" {
			t.Errorf("ServiceMonitor %s: jobLabel %q", name, m.Spec.JobLabel)
		}
		svc := r.services[name]
		if svc == nil {
			t.Fatalf("ServiceMonitor %s selects no Service of that name", name)
		}
		job := svc.Labels[m.Spec.JobLabel]
		if job != "hints" && job != "advantages" {
			t.Errorf("ServiceMonitor %s: job label %q, want hints or advantages", name, job)
		}
		if !svc.Spec.PublishNotReadyAddresses {
			t.Errorf("Service %s drops pods that are not ready, so their readiness is never scraped", name)
		}
	}
}

func TestTheRenderedConfigurationLoadsAsTheStagesLoadIt(t *testing.T) {
	bin := env(t, "HINTSTREAM_BIN")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: build it first (cargo build), or set HINTSTREAM_BIN", bin)
	}
	for _, name := range cases {
		r := load(t, name)
		text, config := r.config(t)
		// staticMembership "auto": on with a fixed worker count, off under
		// KEDA; the secured case sets it on.
		wantStatic := name == "keda-off" || name == "secured"
		if config.Kafka["static_membership"] != wantStatic {
			t.Errorf("%s: static_membership %v, want %v", name, config.Kafka["static_membership"], wantStatic)
		}
		if config.Hints.MetricsAddr != "0.0.0.0:9464" || config.Advantages.MetricsAddr != "0.0.0.0:9465" {
			t.Errorf("%s: metrics on %q and %q, not on every interface", name, config.Hints.MetricsAddr, config.Advantages.MetricsAddr)
		}
		dir := t.TempDir()
		file := filepath.Join(dir, "hintstream.toml")
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, ss := range r.statefulSets {
			cmd := exec.Command(bin, "--config", file, "config")
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HINTSTREAM_WORKER_ID=" + ss.Name + "-0",
				"KAFKA_SASL_USERNAME=u", "KAFKA_SASL_PASSWORD=p"}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("%s: hintstream config refuses the rendered hintstream.toml: %v\n%s\n%s", name, err, out, text)
			}
		}
	}
}

func TestHelmRefusesValuesThatBreakTheChartsPromises(t *testing.T) {
	helm, chart := env(t, "HELM"), env(t, "CHART")
	for _, c := range []struct {
		set  []string
		says string
	}{
		{[]string{"hints.autoscaling.maxReplicaCount=7"}, "above topics.partitions"},
		{[]string{"config.kafka.delivery=exactly_once"}, "config.kafka is set by the chart"},
		{[]string{"config.hints.group_id=x"}, "config.hints.group_id is set by the chart"},
		{[]string{"kafka.security.protocol=SASL_SSL"}, "existingSecret"},
		{[]string{"kafka.groupProtocol=eager"}, "groupProtocol"},
		{[]string{"kafka.consumer.session\\.timeout\\.ms=1000"}, "kafka.sessionTimeoutMs"},
		{[]string{"fullnameOverride=" + strings.Repeat("x", 45)}, "longer than 52"},
	} {
		args := []string{"template", "hintstream", chart}
		for _, s := range c.set {
			args = append(args, "--set", s)
		}
		out, err := exec.Command(helm, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.says) {
			t.Errorf("helm template --set %v: want a failure saying %q, got %v:\n%s", c.set, c.says, err, firstLines(out, 5))
		}
	}
}

func firstLines(out []byte, n int) string {
	lines := strings.Split(string(out), "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

// The kinds each case renders, so that a values switch that silently drops
// (or adds) an object fails.
func TestEachValuesFileRendersTheObjectsItPromises(t *testing.T) {
	want := map[string]string{
		"default":      "ConfigMap=2 Job=1 PodDisruptionBudget=2 PrometheusRule=1 ScaledObject=2 Service=2 ServiceAccount=1 ServiceMonitor=2 StatefulSet=2",
		"exactly-once": "ConfigMap=2 Job=1 PodDisruptionBudget=2 PrometheusRule=1 ScaledObject=2 Service=2 ServiceAccount=1 ServiceMonitor=2 StatefulSet=2",
		"secured":      "ConfigMap=2 Job=1 PodDisruptionBudget=2 PrometheusRule=1 ScaledObject=2 Service=2 ServiceAccount=1 ServiceMonitor=2 StatefulSet=2 TriggerAuthentication=1",
		"keda-off":     "ConfigMap=1 PodDisruptionBudget=1 Service=2 ServiceAccount=1 StatefulSet=2",
	}
	for _, name := range cases {
		r := load(t, name)
		counts := map[string]int{}
		for _, o := range r.objects {
			kind := fmt.Sprintf("%T", o)
			counts[kind[strings.LastIndex(kind, ".")+1:]]++
		}
		var parts []string
		for k, n := range counts {
			parts = append(parts, fmt.Sprintf("%s=%d", k, n))
		}
		sort.Strings(parts)
		if got := strings.Join(parts, " "); got != want[name] {
			t.Errorf("%s renders %s, want %s", name, got, want[name])
		}
	}
}
