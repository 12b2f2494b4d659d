// Command nri-lab-plugin is the test bed's NRI plugin, written with containerd/nri's stub.
//
// It connects to a runtime's NRI socket, subscribes to CreateContainer only, and adjusts
// every container it is told about:
//
//   - adds the environment variable given with -env NAME=VALUE;
//   - adds the annotation given with -annotation KEY=VALUE;
//   - with -report KEY, adds NRI_SAW=<value> where value is the annotation KEY as the
//     runtime handed the container to NRI ("" when absent): what an earlier layer (crihook,
//     in front of the runtime) had already set.
//
// It prints "synchronized" once registered with the runtime, and "created NS/POD/NAME" for
// every container, on stdout, so a test can wait for it and see what it handled.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// options are the adjustments the plugin makes; pairs are {key, value}.
type options struct {
	env        [2]string
	annotation [2]string
	report     string
}

type plugin struct {
	opts options
}

// Synchronize is called once, right after registration: the plugin is in effect from now on.
func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	fmt.Printf("synchronized (%d pods, %d containers)\n", len(pods), len(ctrs))
	return nil, nil
}

// CreateContainer returns the adjustment for one container; other containers are left alone.
func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	fmt.Printf("created %s/%s/%s\n", pod.GetNamespace(), pod.GetName(), ctr.GetName())
	return adjustment(p.opts, ctr.GetAnnotations()), nil, nil
}

// adjustment is the plugin's whole logic: what to change, given what the runtime received.
func adjustment(o options, annotations map[string]string) *api.ContainerAdjustment {
	adj := &api.ContainerAdjustment{}
	if o.env[0] != "" {
		adj.AddEnv(o.env[0], o.env[1])
	}
	if o.annotation[0] != "" {
		adj.AddAnnotation(o.annotation[0], o.annotation[1])
	}
	if o.report != "" {
		adj.AddEnv("NRI_SAW", annotations[o.report])
	}
	return adj
}

func splitPair(flagName, text string) ([2]string, error) {
	if text == "" {
		return [2]string{}, nil
	}
	key, value, ok := strings.Cut(text, "=")
	if !ok || key == "" {
		return [2]string{}, fmt.Errorf("-%s wants KEY=VALUE, got %q", flagName, text)
	}
	return [2]string{key, value}, nil
}

func run() error {
	socket := flag.String("socket", api.DefaultSocketPath, "the runtime's NRI socket")
	name := flag.String("name", "crihook-lab", "plugin name")
	idx := flag.String("idx", "50", "plugin index (order among NRI plugins)")
	env := flag.String("env", "", "add this environment variable: NAME=VALUE")
	annotation := flag.String("annotation", "", "add this annotation: KEY=VALUE")
	report := flag.String("report", "", "add NRI_SAW=<value of this annotation as NRI got it>")
	flag.Parse()

	var o options
	var err error
	if o.env, err = splitPair("env", *env); err != nil {
		return err
	}
	if o.annotation, err = splitPair("annotation", *annotation); err != nil {
		return err
	}
	o.report = *report

	s, err := stub.New(&plugin{opts: o},
		stub.WithSocketPath(*socket), stub.WithPluginName(*name), stub.WithPluginIdx(*idx))
	if err != nil {
		return fmt.Errorf("creating the NRI stub: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err = s.Run(ctx)
	if errors.Is(err, context.Canceled) {
		return nil // SIGTERM/SIGINT: a normal stop
	}
	return err
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "nri-lab-plugin: %v\n", err)
		os.Exit(1)
	}
}
